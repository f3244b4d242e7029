"""How a run's checkpoints are written (the guard in `tgnb.train.preemption` decides when).

`Saver.save` writes ``checkpoint-<step>`` through `tgnb.train.dcpio`: every rank its RNG file and
its DCP shard, rank 0 the small JSON files; every rank checksums its DCP files as it writes them
(`tgnb.train.hashwriter`; DCP fsyncs them) and fsyncs and checksums the small files it wrote
(`tgnb.train.checkpoint.digest`, the ranks in parallel); the entries are all-gathered (with any
rank's failure, so that every rank fails alike), and rank 0 seals the checkpoint
(`tgnb.train.checkpoint.write_marker`: the marker last), rotates older ones and records
``CheckpointSaved``. Synchronous saves (preemption, final) return once sealed. Asynchronous ones
(periodic) return once the state is staged in CPU memory -- that time is the *stall* Young/Daly
uses -- and are written by ``dcp.async_save`` in the background and sealed from a thread on every
rank (its gather runs on the saves' own group, after DCP's collectives; the next save waits for it).
At most one is in flight: the next save waits for it first.

A failed save (``ENOSPC`` and the like) is reported (``CheckpointFailed`` and a log line naming the
directory and the cause); its directory, never complete, is removed; the last complete checkpoint is
untouched. ``Saver.failure`` then holds the cause, and the guard stops the run with
`tgnb.runs.node.Exit.NO_SPACE` (74, disk full) or raises -- on every rank: a failure only rank 0
saw (its marker) reaches the others at the next step boundary or at `finish` (`failed_elsewhere`).
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tgnb.errors import CheckpointError
from tgnb.events import CHECKPOINT_FAILED, CHECKPOINT_SAVED
from tgnb.train import checkpoint as ck
from tgnb.train import dcpio, dcpwriter
from tgnb.train.record import Recorder


def no_space(exc: BaseException | None, disk: Path | None = None, need: int = 0) -> bool:
    """Whether `exc` (or an error it wraps, as DCP's CheckpointException does) is ENOSPC -- or,
    when given, `disk` has less than `need` bytes free (a full disk also surfaces as other errors,
    e.g. torch's zip writer's "unexpected pos")."""
    if exc is not None and disk is not None and disk.exists():
        return shutil.disk_usage(disk).free < max(need, 1) or no_space(exc)
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


class Saver:
    """Writes, seals and rotates the checkpoints of one run."""

    def __init__(self, ckpt_dir: Path, recorder: Recorder, keep_last: int) -> None:
        self.ckpt_dir = ckpt_dir
        self.recorder = recorder
        self.keep_last = keep_last
        self.writer = dcpwriter.Writer()
        self.last: ck.Checkpoint | None = None
        self.last_step = 0  # the step of the newest save begun (complete or in flight)
        self.stall_s: float | None = None  # mean training stall of a save (Young/Daly's C)
        self.write_s: float | None = None  # mean time from a save's start to its marker
        self.failure: BaseException | None = None
        self.no_space = False  # the failure was a full disk
        self._stalls: list[float] = []
        self._writes: list[float] = []
        self._sealer: threading.Thread | None = None
        self._pending: dict[str, Any] | None = None

    def save(self, what: Any, step: int, trigger: str, meta: dict[str, Any], sync: bool) -> None:
        """Checkpoint `what` (a `tgnb.train.dcpio.State`, or a Trainer) at `step` (every rank
        calls it at the same step boundary)."""
        parts = dcpio.state_of(what)
        self.wait()
        if self.failure is not None or (step == self.last_step and self.last is not None):
            return  # a disk already full; or this very step is saved already
        path = self.ckpt_dir / f"{ck.PREFIX}{step}"
        began = time.monotonic()
        job = {"path": path, "step": step, "trigger": trigger, "meta": meta, "began": began}
        try:
            state, plain = dcpio.split_state(parts.model, parts.optimizer, meta["adapter_only"])
            state = dcpio.own_share(state)
            try:  # this rank's own files, before DCP's collectives (done when they are); a
                # failure here is told to the other ranks when sealing, so every rank goes on
                dcpio.write_small(path, parts, plain)
            except Exception as exc:
                job["local_error"] = exc
            if sync:  # DCP reports a failure on any rank to every rank
                self.writer.save(path, state)
            else:
                fut = self.writer.save_async(path, state)
        except Exception as exc:
            self._failed(job, exc)
            return
        if sync and trigger == "final" and parts.export is not None:  # the Trainer's own
            try:  # export, loadable by from_pretrained
                parts.export(path)
                (path / "training_args.bin").unlink(missing_ok=True)  # a pickle: not kept
            except Exception as exc:
                job.setdefault("local_error", exc)
        self.last_step = step
        stall = time.monotonic() - began
        self._stalls.append(stall)
        self.stall_s = sum(self._stalls[-8:]) / len(self._stalls[-8:])
        job["stall_s"] = stall
        if sync:
            self._seal(job)
        else:
            self._pending = job
            self._sealer = threading.Thread(
                target=self._after, args=(fut, job), name="tgnb-ckpt-seal", daemon=True
            )
            self._sealer.start()

    def _after(self, fut: Any, job: dict[str, Any]) -> None:
        try:
            fut.result()
        except BaseException as exc:
            job["error"] = exc
            return
        self._seal(job)

    def wait(self) -> None:
        """Wait for the save in flight (written and sealed); record its failure if it failed."""
        if self._sealer is not None:
            self.writer.wait()
            self._sealer.join()
            self._sealer = None
        job, self._pending = self._pending, None
        if job is not None and "error" in job:
            self._failed(job, job["error"])

    def failed_elsewhere(self, no_space: bool) -> None:
        """Another rank reported a failed save this rank did not see (rank 0's marker): fail too,
        so that every rank stops alike."""
        if self.failure is None:
            self.failure = CheckpointError("a checkpoint failed on another rank (see its log)")
            self.no_space = no_space

    @property
    def busy(self) -> bool:
        return self._sealer is not None and self._sealer.is_alive()

    @property
    def async_failed(self) -> bool:
        """Whether the save in flight has ended with an error (`wait` reports it)."""
        job = self._pending
        return job is not None and not self.busy and "error" in job

    def _seal(self, job: dict[str, Any]) -> None:
        path, step = job["path"], job["step"]
        try:  # every rank its own files, in parallel; every rank learns of any failure
            if "local_error" in job:
                raise job["local_error"]
            written = self.writer.written.pop(path, {})  # DCP's files, hashed as written
            rest = [f for f in dcpio.own_files(path) if f not in written]  # JSON, RNG: small
            mine: Any = [*written.values(), *ck.digest(path, rest)]
        except Exception as exc:  # sent as text: any exception pickles as that
            mine = f"rank {dcpio.rank()}: {type(exc).__name__}: {exc}"
        parts = self.writer.gather(mine)
        try:
            for part in parts:
                if isinstance(part, str):
                    raise CheckpointError(f"writing {path.name} failed on {part}")
            self._writes = [*self._writes[-7:], time.monotonic() - job["began"]]
            self.write_s = sum(self._writes) / len(self._writes)  # every rank weighs it (auto)
            if dcpio.rank() != 0:
                self.last = ck.Checkpoint(path, step, time.time(), 0)
                return
            entries = [e for part in parts for e in part]
            ckpt = ck.write_marker(
                path, step, entries=entries, trigger=job["trigger"], **job["meta"]
            )
        except Exception as exc:
            job["error"] = exc
            if threading.current_thread() is threading.main_thread():
                self._failed(job, exc)
            return
        took = time.monotonic() - job["began"]  # to the marker: the older ones go after it
        removed = ck.rotate(self.ckpt_dir, self.keep_last, ckpt)
        self.recorder.event(
            CHECKPOINT_SAVED,
            f"{path.name}: {ckpt.bytes} bytes in {took:.3f} s (stall {job['stall_s']:.3f} s)",
            step=step,
            bytes=ckpt.bytes,
            files=len(ckpt.files),
            duration_s=round(took, 4),
            stall_s=round(job["stall_s"], 4),
            trigger=job["trigger"],
            world_size=job["meta"].get("world_size"),
            checkpoint=str(path),
            removed=[p.name for p in removed],
        )
        self.last = ckpt

    def _failed(self, job: dict[str, Any], exc: BaseException) -> None:
        path = job["path"]
        self.failure = exc
        need = self.last.bytes if self.last is not None and self.last.bytes else 1 << 20
        full = no_space(exc, self.ckpt_dir, need)
        self.no_space = full
        disk = self.ckpt_dir
        free = shutil.disk_usage(disk).free if disk.exists() else None
        cause = f"disk full on {disk} ({free} bytes free)" if full else f"{type(exc).__name__}"
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        msg = (
            f"checkpoint {path.name} failed: {cause}: {first}; the last complete checkpoint is kept"
        )
        print(f"tgnb: rank {dcpio.rank()} {msg}", file=sys.stderr, flush=True)
        if dcpio.rank() == 0:
            ck.remove(path)  # never complete: it holds no marker
            with contextlib.suppress(OSError):  # the events file may be on the full disk too
                self.recorder.event(
                    CHECKPOINT_FAILED,
                    msg,
                    step=job["step"],
                    trigger=job["trigger"],
                    no_space=full,
                    disk=str(disk),
                    checkpoint=str(path),
                )
