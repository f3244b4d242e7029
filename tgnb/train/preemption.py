"""Checkpoint on preemption, periodically, and at the end; resume from the newest complete checkpoint.

`CheckpointGuard` is what the runner wraps a TRL/transformers trainer with::

    guard = CheckpointGuard(policy, run_dir, recorder)       # installs the SIGTERM flag handler
    args = GRPOConfig(**guard.training_args(kwargs))
    trainer = GRPOTrainer(..., args=args, callbacks=guard.callbacks())
    guard.attach(trainer)                                    # single process: immediate saves
    with contextlib.suppress(Preempted):                     # left mid-step after its checkpoint
        trainer.train(resume_from_checkpoint=guard.resume_from())
    sys.exit(guard.finish(trainer))                          # 0 finished, 75 preempted

How a preemption is handled. A SIGTERM (the Kubernetes path; also SIGUSR1, which Slurm's
``--signal`` can send) only sets a flag. A drain notice with no signal (the Slurm path; see
`tgnb.train.watcher`) sets another.

- One process (`attach` took the trainer over; `tgnb.train.sealing`): the checkpoint is written at
  once, from the last step boundary, by `tgnb.train.immediate` -- between two optimizer steps the
  weights, optimizer and scheduler do not change, so the step in progress need not end first. It is
  abandoned (never applied, never logged) and recomputed after the resume from the same data
  position and RNG states (those of the boundary, taken at every ``on_step_end``).
- Several processes: at every optimizer-step boundary (``on_step_end``) the flags of all ranks are
  combined with one ``all_reduce(MAX)`` of a three-int tensor, so every rank decides the same thing
  at the same step. If any rank was told to stop, all of them ask the Trainer to save *this* step's
  checkpoint and stop. After the Trainer's save every rank meets at a barrier (each rank writes its
  own RNG file), then rank 0 seals the checkpoint with `tgnb.train.checkpoint.write_marker`.

`finish` tells "preempted" from "finished", records the exit, under Slurm requeues its own job after
a drain notice, and returns `EXIT_PREEMPTED` (75) or 0.

Why not transformers' ``enable_jit_checkpoint`` (``transformers/trainer_jit_checkpoint.py``): it waits
``kill_wait=3`` s after SIGTERM before asking for a checkpoint, then saves only at
``on_pre_optimizer_step``, once the step in progress has been computed in full (and is then thrown
away: ``checkpoint-83`` saved, training stopped at step 84), through the Trainer's slower save; its
ranks do not agree on the step; and its "incomplete" sentinel is created *after* the directory, so a kill in
between leaves a directory that looks complete. We force it off (its SIGTERM handler would replace
ours) and reuse its sentinel name only to recognise such directories as torn.

Periodic checkpoints: every `CheckpointPolicy.every_steps` steps, every `every_seconds` seconds of
training, or with `auto` at the Young/Daly interval sqrt(2*C*M), where C is the measured checkpoint
cost (seconds from the save decision to the sealed marker, an average over the saves so far; before
the first save it is estimated from the model's size at 200 MB/s) and M = 3600 / preemptions_per_hour.
The interval is converted to steps with the measured mean step time (the time between
``on_step_begin`` and ``on_step_end``, so saves do not count). A final checkpoint is written at
``max_steps``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tgnb.events import (
    DRAIN_NOTICE,
    RUN_EXITED,
    RUN_REQUEUED,
    RUN_RESUMED,
    SIGNAL_RECEIVED,
    format_time,
    parse_time,
    read_jsonl,
)
from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck
from tgnb.train import express, fastsave
from tgnb.train.immediate import SIGNALS, ImmediateSaver, Preempted
from tgnb.train.policy import CheckpointPolicy
from tgnb.train.record import Recorder
from tgnb.train.sealing import GuardSaving, _dist, _rank
from tgnb.train.watcher import DrainWatcher

__all__ = ["EXIT_PREEMPTED", "CheckpointGuard", "GuardCallback", "Preempted"]

#: Training arguments the guard owns; values given for them are replaced.
OWNED_ARGS = (
    "output_dir",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "save_only_model",
    "enable_jit_checkpoint",
    "ignore_data_skip",
)
_ASSUMED_WRITE_BPS = 200e6


class CheckpointGuard(GuardSaving):
    """Checkpoint-and-exit on SIGTERM or a drain notice, periodic and final checkpoints, resume."""

    def __init__(
        self, policy: CheckpointPolicy, run_dir: str | os.PathLike[str], recorder: Recorder
    ):
        self.policy = policy
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.recorder = recorder
        self.signal_received: tuple[int, float] | None = None  # (signum, time.time())
        self.drain_notice: tuple[str, dict[str, Any], float] | None = None
        self.stop_reason: str | None = None  # "signal" | "drain" once training was asked to stop
        self.resumed_step: int | None = None
        self.last_checkpoint: ck.Checkpoint | None = None
        self.checkpoint_cost_s: float | None = None
        self.step_time_s: float | None = None
        self._reported: set[str] = set()
        self._previous: dict[int, Any] = {}
        self._watcher: DrainWatcher | None = None
        self._step_began: float | None = None
        self._save_began: float | None = None
        self._save_reason = ""
        self._last_save_step = 0
        self._last_save_time = time.monotonic()
        self._saves = 0
        self._estimated_cost_s: float | None = None  # before the first save: from the model's size
        self._trainer: Any = None  # set by attach(): the guard writes checkpoints itself
        self._saver: ImmediateSaver | None = None
        self._spare: express.SpareKeeper | None = None  # the express checkpoint's allocated file
        self._boundary: tuple[int, dict[str, Any]] | None = None  # (step, RNG states) at its end
        self._known: list[ck.FileEntry] = []  # entries the fast writer already hashed and fsynced
        self._sealed: tuple[ck.Checkpoint, float, float] | None = None  # sealed as written
        if policy.on_signal:
            self._install_signal_handlers()
        if policy.watch_drain and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            self._watcher = DrainWatcher(self._on_drain_notice, policy.drain_poll_seconds).start()

    # -- flags: set from a signal handler or the watcher thread, read at step boundaries ----------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signal_received is None:
            self.signal_received = (signum, time.time())

    def _on_drain_notice(self, source: str, details: dict[str, Any]) -> None:
        if self.drain_notice is None:
            self.drain_notice = (source, details, time.time())
        if self._saver is not None:
            self._saver.poke()

    def _stop_asked(self) -> str | None:
        if self.signal_received is not None:
            return "signal"
        return "drain" if self.drain_notice is not None else None

    def _install_signal_handlers(self) -> None:
        for sig in SIGNALS:
            with contextlib.suppress(ValueError):  # not the main thread: the caller handles signals
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous.clear()

    def request_stop(self, reason: str = "signal") -> None:
        """Ask for checkpoint-and-exit at the next step boundary, as a signal or notice would."""
        if reason == "drain":
            self._on_drain_notice("request", {})
        else:
            self._on_signal(int(signal.SIGTERM), None)

    # -- what the runner calls ---------------------------------------------------------------------
    def training_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`kwargs` for ``GRPOConfig``/``DPOConfig`` with the checkpoint settings the guard owns.

        Checkpoints go to ``run_dir/checkpoints``; the Trainer's own save schedule and rotation are
        off (the guard decides when to save and rotates only sealed checkpoints); transformers' JIT
        checkpoint is off (see the module docstring); data skipping on resume stays on so the data
        position is restored.
        """
        out = dict(kwargs)
        out.update(
            output_dir=str(self.ckpt_dir),
            save_strategy="no",
            save_total_limit=None,
            save_only_model=False,
            enable_jit_checkpoint=False,
            ignore_data_skip=False,
        )
        out.pop("save_steps", None)
        return out

    def callbacks(self) -> list[TrainerCallback]:
        """The trainer callbacks that implement the guard (pass them to the trainer)."""
        return [GuardCallback(self)]

    def resume_from(self) -> str | None:
        """The path to resume from: the newest complete checkpoint's (verified by size and
        checksums), or None. An express checkpoint (`tgnb.train.express`) is first written out in
        the Trainer's layout under ``checkpoints/.resume-rank<R>`` (removed by `close`), and that
        is the path returned.

        Torn checkpoints newer than it are removed by rank 0 (no save is in progress at
        start-up), which first gives a checkpoint left sealed in the spare its name
        (`tgnb.train.express.adopt_sealed`). Records ``RunResumed`` with the step and the restart
        count.
        """
        chosen: ck.Checkpoint | None = None
        if _rank() == 0:
            with contextlib.suppress(OSError):  # else it is found under its staging name
                express.adopt_sealed(self.ckpt_dir)
        for path in ck.checkpoint_dirs(self.ckpt_dir):
            chosen = ck.verify(path)
            if chosen is not None:
                break
            if _rank() == 0:
                ck._remove(path)
        dist = _dist()
        if dist is not None:
            box: list[Any] = [str(chosen.path) if chosen else None]
            dist.broadcast_object_list(box, src=0)  # every rank resumes from rank 0's choice
            if box[0] is None:
                chosen = None
            elif chosen is None or str(chosen.path) != box[0]:
                chosen = ck.read_marker(str(box[0]))
        if chosen is None:
            return None
        resume = str(chosen.path)
        if express.is_express(chosen.path):  # a preemption's one-file checkpoint
            resume = str(express.expand(chosen.path, self.ckpt_dir / f".resume-rank{_rank()}"))
        self.resumed_step = chosen.step
        self._last_save_step = chosen.step
        self.last_checkpoint = chosen
        self.recorder.event(
            RUN_RESUMED,
            f"resumed from {chosen.name} at step {chosen.step}",
            step=chosen.step,
            restart_count=self.restart_count(),
            checkpoint=str(chosen.path),
        )
        return resume

    def restart_count(self) -> int:
        """How many times this run has been restarted: Slurm's count, ours, or events so far."""
        for name in ("SLURM_RESTART_COUNT", "TGNB_RESTART_COUNT"):
            value = os.environ.get(name)
            if value and value.isdigit():
                return int(value)
        events = read_jsonl(self.run_dir / "events.jsonl")
        return 1 + sum(1 for ev in events if ev.reason == RUN_RESUMED)

    def finish(self, trainer: Any) -> int:
        """After ``trainer.train()`` returned: 0 when the run finished, `EXIT_PREEMPTED` when it
        stopped for a signal or a drain notice. Records ``RunExited`` (and ``RunRequeued`` when it
        requeued its Slurm job after a drain notice). Every rank calls it; rank 0 leaves last."""
        self.close()
        self._report_notices(int(trainer.state.global_step))
        step = int(trainer.state.global_step)
        done = step >= int(trainer.state.max_steps)
        code = 0 if done or self.stop_reason is None else EXIT_PREEMPTED
        reason = "finished" if code == 0 else "preempted"
        if code and self.stop_reason == "drain":
            self._requeue()
        last = self.last_checkpoint
        self.recorder.event(
            RUN_EXITED,
            f"{reason} at step {step}",
            exit_reason=reason,
            exit_code=code,
            step=step,
            checkpoint_step=last.step if last else None,
        )
        print(f"tgnb: rank {_rank()} {reason} at step {step}", file=sys.stderr, flush=True)
        dist = _dist()
        if dist is not None:
            dist.barrier()
        return code

    def close(self) -> None:
        """Stop the drain watcher and the immediate saver, give the signal handlers back, restore
        torch.save's CRC32."""
        self._crc32_restore()
        if self._saver is not None:
            self._saver.close()
            self._saver = None
        if self._spare is not None:
            self._spare.close()
            self._spare = None
        shutil.rmtree(self.ckpt_dir / f".resume-rank{_rank()}", ignore_errors=True)
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        self._restore_signal_handlers()

    def __enter__(self) -> CheckpointGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------------
    def _requeue(self) -> None:
        job = os.environ.get("SLURM_JOB_ID")
        if not (job and self.policy.requeue_on_drain and _rank() == 0):
            return
        self.recorder.event(RUN_REQUEUED, f"scontrol requeue {job}", job_id=job)
        try:
            subprocess.run(
                ["scontrol", "requeue", job], capture_output=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            self.recorder.event(RUN_REQUEUED, f"scontrol requeue {job} failed: {exc}", job_id=job)

    def _report_notices(self, step: int) -> None:
        if self.signal_received and "signal" not in self._reported:
            self._reported.add("signal")
            signum, at = self.signal_received
            name = signal.Signals(signum).name
            self.recorder.event(
                SIGNAL_RECEIVED,
                f"{name}: checkpoint at step {step} and exit",
                signal=name,
                received_at=format_time(parse_time(at)),
                step=step,
            )
        if self.drain_notice and "drain" not in self._reported:
            self._reported.add("drain")
            source, details, at = self.drain_notice
            self.recorder.event(
                DRAIN_NOTICE,
                f"drain notice ({source}): checkpoint at step {step} and exit",
                via=source,
                received_at=format_time(parse_time(at)),
                step=step,
                **{k: v for k, v in details.items() if k in ("node", "state", "path", "notice")},
            )

    def _periodic_due(self, step: int, model: Any) -> bool:
        p = self.policy
        if p.every_steps and step % p.every_steps == 0:
            return True
        if p.every_seconds and time.monotonic() - self._last_save_time >= p.every_seconds:
            return True
        if p.auto and self.step_time_s:
            cost = self.checkpoint_cost_s
            if cost is None:
                if self._estimated_cost_s is None:  # once: weights, and Adam's two moments
                    nbytes = sum(
                        t.numel() * t.element_size() * (3 if t.requires_grad else 1)
                        for t in model.parameters()
                    )
                    self._estimated_cost_s = nbytes / _ASSUMED_WRITE_BPS
                cost = self._estimated_cost_s
            every = ck.young_daly_steps(cost, p.preemptions_per_hour, self.step_time_s)
            return step - self._last_save_step >= every
        return False

    def on_step_begin(self) -> None:
        if self._saver is not None:
            self._saver.step_begin()  # raises Preempted once a mid-step checkpoint is complete
        self._step_began = time.monotonic()

    def on_pre_optimizer_step(self) -> None:
        if self._saver is not None:
            self._saver.pre_optimizer_step()

    def on_substep_end(self) -> None:
        if self._saver is not None:
            self._saver.substep_end()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any) -> None:
        import torch

        now = time.monotonic()
        if self._step_began is not None:
            took = now - self._step_began
            self.step_time_s = (
                took if self.step_time_s is None else 0.8 * self.step_time_s + 0.2 * took
            )
        step = int(state.global_step)
        if self._trainer is not None:
            self._boundary = (step, fastsave.capture_rng())
            if self._spare is not None and step < int(state.max_steps):
                self._spare.step_end(self._trainer, self._boundary[1], step)
        flags = [
            int(self.signal_received is not None),
            int(self.drain_notice is not None),
            int(self._periodic_due(step, model)),
        ]
        dist = _dist()
        if dist is not None:
            device = args.device if dist.get_backend() != "gloo" else "cpu"
            t = torch.tensor(flags, dtype=torch.int32, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            flags = [int(x) for x in t.tolist()]
        signalled, drained, due = flags
        final = step >= int(state.max_steps)
        if (signalled or drained) and not final:
            self.stop_reason = self.stop_reason or (
                "drain" if drained and not signalled else "signal"
            )
            if self.stop_reason == "drain" and self.drain_notice is None:
                self.drain_notice = ("peer", {}, time.time())
            if self.stop_reason == "signal" and self.signal_received is None:
                self.signal_received = (int(signal.SIGTERM), time.time())
            self._report_notices(step)
            control.should_training_stop = True
            control.should_save = True
            self._save_reason = self.stop_reason
        elif final:
            control.should_save = True
            self._save_reason = "final"
        elif due:
            control.should_save = True
            self._save_reason = "periodic"
        if control.should_save:
            self._save_began = now
            stale = self.ckpt_dir / f"{ck.PREFIX}{step}"
            rank = int(dist.get_rank()) if dist is not None else _rank()
            if rank == 0 and stale.exists():  # never save into a leftover of an earlier attempt
                ck._remove(stale)
            self._crc32_off()


class GuardCallback(TrainerCallback):
    """The trainer callback of a `CheckpointGuard` (all decisions are the guard's)."""

    def __init__(self, guard: CheckpointGuard) -> None:
        self.guard = guard

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_step_begin()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_pre_optimizer_step()

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_substep_end()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_step_end(args, state, control, kwargs.get("model"))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.guard.on_save(state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard._watcher is not None:
            self.guard._watcher.stop()
            self.guard._watcher = None
