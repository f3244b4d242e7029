"""How a `tgnb.train.preemption.CheckpointGuard` writes and seals checkpoints (the guard decides
when; this part decides how).

- `GuardSaving.attach` takes over ``Trainer._save_checkpoint`` of a single-process trainer: every
  step-boundary checkpoint is then written by `tgnb.train.fastsave` (the Trainer's layout, hashed
  while written, large files through ``O_DIRECT``), and an `tgnb.train.immediate.ImmediateSaver`
  checkpoints the last step boundary the moment a signal or drain notice arrives, as one file
  written into space allocated beforehand (`tgnb.train.express`). The final
  checkpoint stays the Trainer's own (config, tokenizer and all, loadable by ``from_pretrained``).
  Several processes, DeepSpeed, FSDP, PEFT adapters or a gradient scaler keep the Trainer's save,
  at the next step boundary, with torch.save's CRC32 off during it.
- `GuardSaving._seal` writes the completion marker (`tgnb.train.checkpoint.write_marker`) on rank 0,
  rotates, records ``CheckpointSaved`` and keeps the measured checkpoint cost for Young/Daly.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tgnb.events import CHECKPOINT_SAVED
from tgnb.train import checkpoint as ck
from tgnb.train import express, fastsave, hashedio
from tgnb.train.immediate import SIGNALS, ImmediateSaver
from tgnb.train.policy import CheckpointPolicy
from tgnb.train.record import Recorder

__all__ = ["GuardSaving"]

#: torch.save's CRC32 setting from before a guard's save turned it off (None: not turned off).
#: Process-wide, like the setting itself, so two guards in one process cannot restore it wrongly.
_CRC32_BEFORE: bool | None = None


def _dist() -> Any:
    """`torch.distributed` when a process group of more than one rank is up, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _rank() -> int:
    dist = _dist()
    return int(dist.get_rank()) if dist is not None else int(os.environ.get("RANK", "0"))


def _world() -> int:
    dist = _dist()
    return int(dist.get_world_size()) if dist is not None else 1


class GuardSaving:
    """The writing-and-sealing half of `CheckpointGuard` (a mixin: the guard holds the state)."""

    policy: CheckpointPolicy
    ckpt_dir: Path
    recorder: Recorder
    stop_reason: str | None
    last_checkpoint: ck.Checkpoint | None
    checkpoint_cost_s: float | None
    _trainer: Any
    _saver: ImmediateSaver | None
    _spare: express.SpareKeeper | None
    _boundary: tuple[int, dict[str, Any]] | None
    _known: list[ck.FileEntry]
    _sealed: tuple[ck.Checkpoint, float, float] | None  # with its time.time(), time.monotonic()
    _save_reason: str
    _save_began: float | None
    _saves: int
    _last_save_step: int
    _last_save_time: float

    def _on_signal(self, signum: int, _frame: Any) -> None:
        raise NotImplementedError

    def _stop_asked(self) -> str | None:
        raise NotImplementedError

    def _report_notices(self, step: int) -> None:
        raise NotImplementedError

    def attach(self, trainer: Any) -> bool:
        """Let the guard write `trainer`'s checkpoints itself, and on a signal or drain notice at
        once, from the last step boundary, while the step in progress is abandoned
        (`tgnb.train.immediate`). Only for a single process on the CPU or CUDA without DeepSpeed,
        FSDP, PEFT or a gradient scaler (`tgnb.train.fastsave.check_supported`); otherwise, and
        for the final checkpoint, the Trainer's own save is used. Returns whether it attached.
        """
        try:
            fastsave.check_supported(trainer, optimizer=False)
        except fastsave.Unsupported:
            return False
        self._trainer = trainer
        hashedio.prepare(2)  # the staging buffers of the two large files, touched now
        trainer._save_checkpoint = functools.partial(
            self._save_checkpoint, trainer._save_checkpoint
        )
        if self.policy.on_signal or self.policy.watch_drain:
            self._spare = express.SpareKeeper(self.ckpt_dir)
            self._saver = ImmediateSaver(
                self._snapshot,
                lambda: self._boundary is not None,
                lambda signum: self._on_signal(signum, None),
                self._stop_asked,
                SIGNALS,
            )
            self._saver.hold_on_grads(trainer.model.parameters())
        return True

    def _save_checkpoint(self, original: Any, model: Any, trial: Any = None) -> None:
        """``Trainer._save_checkpoint`` of an attached trainer: the fast writers at step
        boundaries (the RNG states are this boundary's), the Trainer's own for the final one."""
        trainer = self._trainer
        if self._save_reason != "final":
            trainer.store_flos()
            path = self.ckpt_dir / f"{ck.PREFIX}{int(trainer.state.global_step)}"
            try:
                self._write(path, fastsave.capture_rng())
                return
            except fastsave.Unsupported:
                pass
        self._known = []
        original(model, trial)

    def _write(self, path: Path, rng: dict[str, Any]) -> None:
        """Write checkpoint `path` of the trainer as it is now (`rng`: the boundary's RNG
        states): an express one when stopping and the state is small enough
        (`tgnb.train.express`, which writes its marker as soon as its data is durable: `_seal`
        finds it in `_sealed`), else the Trainer's layout (`tgnb.train.fastsave`). Raises
        `fastsave.Unsupported` when neither can."""
        if (
            self._spare is not None
            and self._spare.usable
            and self._save_reason in ("signal", "drain")
        ):
            step = int(ck.step_of(path) or 0)
            extra = {"reason": self._save_reason, "world_size": _world()}
            made: list[ck.Checkpoint] = []
            at: list[tuple[float, float]] = []

            def seal(entries: list[ck.FileEntry]) -> bytes:
                ckpt, raw = ck.marker_record(path, step, entries, **extra)
                made.append(ckpt)
                return raw

            try:
                with self._spare.lock:
                    express.write(
                        self._trainer,
                        path,
                        rng,
                        seal=seal,
                        plan=self._spare.plan,
                        durable=lambda: at.append((time.time(), time.monotonic())),
                        log=self._spare.log,
                    )
            except fastsave.Unsupported:
                pass
            except OSError:
                if at:  # sealed in the spare, not renamed: it is a checkpoint now, keep it
                    self._spare.retire()
                raise
            else:  # its marker is written (only once the write succeeded), and when
                self._sealed = (made[0], *at[0])
                return
        self._known = fastsave.write_checkpoint(self._trainer, path, rng)

    def _snapshot(self, reason: str) -> bool:
        """In the immediate saver's thread, outside the update section: checkpoint the last step
        boundary (False when there is none yet in this process)."""
        if self._boundary is None or self._trainer is None:
            return False
        began = time.monotonic()
        step, rng = self._boundary
        self.stop_reason = self.stop_reason or reason
        if self.last_checkpoint is not None and self.last_checkpoint.step == step:
            self._report_notices(step)
            return True
        self._save_reason = reason
        path = self.ckpt_dir / f"{ck.PREFIX}{step}"
        if path.exists():
            ck._remove(path)
        self._write(path, rng)
        self._seal(step, began, lambda: self._report_notices(step))  # events once it is durable
        return True

    def _crc32_off(self) -> None:
        """Skip the CRC32 torch.save computes over every record of its zip container, for the
        Trainer's save that follows (optimizer, scheduler, RNG states): it costs as much as the
        write itself, and the checkpoint's manifest checksums, verified on resume, cover the same
        bytes. torch.load does not check these CRCs."""
        import torch.serialization as ts

        global _CRC32_BEFORE
        if _CRC32_BEFORE is None and hasattr(ts, "set_crc32_options"):
            _CRC32_BEFORE = bool(ts.get_crc32_options())
            ts.set_crc32_options(False)

    def _crc32_restore(self) -> None:
        global _CRC32_BEFORE
        if _CRC32_BEFORE is not None:
            import torch.serialization as ts

            ts.set_crc32_options(_CRC32_BEFORE)
            _CRC32_BEFORE = None

    def on_save(self, state: Any) -> None:
        self._crc32_restore()
        began = self._save_began if self._save_began is not None else time.monotonic()
        step = int(state.global_step)
        dist = _dist()
        if dist is not None:
            dist.barrier()  # every rank has written its files (its RNG state) into the directory
        self._seal(step, began)
        if dist is not None:
            dist.barrier()  # the marker is written before any rank goes on (or exits)

    def _seal(self, step: int, began: float, then: Callable[[], None] | None = None) -> None:
        """Rank 0: write the marker of checkpoint `step` (saved since `began`), call `then`,
        rotate, record."""
        path = self.ckpt_dir / f"{ck.PREFIX}{step}"
        seal_began = time.monotonic()
        known, self._known = self._known, []
        sealed, self._sealed = self._sealed, None
        if _rank() == 0:
            if sealed is not None:  # sealed as written: complete since then
                ckpt, sealed_at, sealed_mono = sealed
            else:
                ckpt = ck.write_marker(
                    path, step, known=known, reason=self._save_reason, world_size=_world()
                )
                sealed_at, sealed_mono = time.time(), time.monotonic()
            seal_s = max(0.0, sealed_mono - seal_began)  # the marker is durable; rotation follows
            if then is not None:
                then()
            removed = ck.rotate(self.ckpt_dir, self.policy.keep_last, newest=ckpt)
            done = time.monotonic()
            self.recorder.event(
                CHECKPOINT_SAVED,
                f"{path.name}: {ckpt.bytes} bytes in {done - began:.3f} s",
                step=step,
                bytes=ckpt.bytes,
                files=len(ckpt.files),
                duration_s=round(done - began, 4),
                seal_s=round(seal_s, 4),
                sealed_at=sealed_at,
                started_at=round(sealed_at - (sealed_mono - began), 6),
                trigger=self._save_reason,
                checkpoint=str(path),
                removed=[p.name for p in removed],
            )
            self.last_checkpoint = ckpt
        else:
            self.last_checkpoint = ck.Checkpoint(path, step, time.time(), 0)
        cost = time.monotonic() - began
        self._saves += 1
        prev = self.checkpoint_cost_s
        self.checkpoint_cost_s = cost if prev is None else prev + (cost - prev) / self._saves
        self._last_save_step = step
        self._last_save_time = time.monotonic()
        self._save_began = None
