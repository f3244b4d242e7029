"""Checkpoint on preemption, periodically, and at the end; resume from the newest complete checkpoint.

`CheckpointGuard` is what the runner wraps a TRL/transformers trainer with::

    guard = CheckpointGuard(policy, run_dir, recorder)     # installs the SIGTERM flag handler
    kwargs = guard.batch_args(kwargs)                       # global batch kept at another world size
    trainer = resumable(GRPOTrainer)(..., args=..., callbacks=guard.callbacks())
    guard.attach(trainer)
    trainer.train(resume_from_checkpoint=guard.resume_from())
    sys.exit(guard.finish(trainer))                         # 0 finished, 75 preempted, 74 disk full

Everything goes through ``TrainerCallback`` hooks and public APIs, plus one documented override
(`resumable`: ``Trainer._load_from_checkpoint`` does nothing, because the guard loads model and
optimizer from DCP at ``on_train_begin``, once they exist and are wrapped; the Trainer still reads
``trainer_state.json`` and skips the data already seen). No process-wide switch is touched.

A preemption: SIGTERM (Kubernetes; SIGUSR1 from Slurm's ``--signal``) only sets a flag, and so does
a drain notice (`tgnb.train.watcher`). At every optimizer-step boundary (``on_step_end``) the flags of
all ranks are combined with one ``all_reduce(MAX)``, so every rank decides the same thing at the same
step. A stop: the save in flight is let finish, this step is saved synchronously and sealed, training
stops, and `finish` returns `EXIT_PREEMPTED` (75) -- under Slurm after a drain notice it first
requeues its own job. Periodic saves (`CheckpointPolicy.every_steps`, ``every_seconds`` or ``auto``:
Young/Daly on the measured *stall* and write time of a save) are asynchronous. The last step is
saved synchronously with the Trainer's own model export beside the DCP state. At a restart the
preemption rate ``auto`` weighs is the launch's estimate updated with the run's own preemptions
since (`tgnb.train.rates`; the local engine re-reads the cluster instead, and that update is then
a no-op).

Resume (`resume_from`): rank 0 verifies the checkpoints newest first (sizes and checksums, then
what loading reads: `dcpio.probe`); one that fails is reported (``CheckpointRejected``, a log line
naming the file and the reason) and moved into ``checkpoints/quarantine``. When checkpoints existed but none is complete the run refuses to start
again from step 0 (`CheckpointError`) unless ``checkpoint.allow_fresh_start`` is set. Every rank
resumes from rank 0's choice.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tgnb.errors import CheckpointError, TrainConfigError
from tgnb.events import (
    CHECKPOINT_INTERVAL,
    CHECKPOINT_REJECTED,
    DRAIN_NOTICE,
    RUN_EXITED,
    RUN_REQUEUED,
    RUN_RESUMED,
    SIGNAL_RECEIVED,
    format_time,
    parse_time,
    read_jsonl,
)
from tgnb.runs import node
from tgnb.runs.policy import AUTO_MAX_SECONDS, CheckpointPolicy
from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck
from tgnb.train import dcpio, ownership, rates
from tgnb.train.record import Recorder
from tgnb.train.saving import EXIT_NO_SPACE, Saver
from tgnb.train.watcher import DrainWatcher

__all__ = ["EXIT_NO_SPACE", "EXIT_PREEMPTED", "CheckpointGuard", "resumable"]

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: What the guard sets in the training arguments: the Trainer's own saves and JIT checkpoint off
#: (the guard saves), data skipping on resume on.
_SETTINGS = {
    "save_strategy": "no",
    "save_total_limit": None,
    "save_only_model": False,
    "enable_jit_checkpoint": False,
    "ignore_data_skip": False,
}
#: Training arguments the guard owns; values given for them are replaced.
OWNED_ARGS = ("output_dir", "save_steps", *_SETTINGS)
_ASSUMED_STAGE_BPS = 1e9  # before the first save: a copy to CPU memory at about 1 GB/s


def resumable(trainer_cls: type) -> type:
    """`trainer_cls` with its one override: ``_load_from_checkpoint`` loads nothing (the guard
    loads the DCP state at ``on_train_begin``; see the module docstring)."""

    class Resumable(trainer_cls):
        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            """Model weights come from DCP at ``on_train_begin`` (`CheckpointGuard`)."""

    Resumable.__name__ = Resumable.__qualname__ = f"Resumable{trainer_cls.__name__}"
    return Resumable


def batch_args(ckpt_dir: Path, kwargs: dict[str, Any], world: int) -> dict[str, Any]:
    """Keep the global batch of the checkpoint to resume from (the Trainer skips the data seen by
    counting steps, so the data position holds only if every step is as large):
    ``gradient_accumulation_steps`` = its global batch / (per-device batch x `world`) when the
    world size or the per-device batch changed."""
    found = ck.checkpoint_dirs(ckpt_dir)
    meta = next((m.meta for p in found if (m := ck.read_marker(p)) is not None), None)
    per_device = int(kwargs.get("per_device_train_batch_size", 8))
    total = int(meta.get("global_batch") or 0) if meta else 0
    if not total or total == per_device * world * int(kwargs.get("gradient_accumulation_steps", 1)):
        return kwargs
    if total % (per_device * world):
        raise TrainConfigError(
            f"the checkpoint's global batch {total} is not a multiple of per-device batch "
            f"{per_device} x {world} ranks; set per_device_train_batch_size to a divisor "
            f"of {total // world}."
        )
    return {**kwargs, "gradient_accumulation_steps": total // (per_device * world)}


class CheckpointGuard:
    """Checkpoint-and-exit on SIGTERM or a drain notice, periodic and final checkpoints, resume."""

    def __init__(
        self, policy: CheckpointPolicy, run_dir: str | os.PathLike[str], recorder: Recorder
    ):
        # a restart: the rate `auto` weighs, updated with the run's own record (Slurm, Kubernetes)
        self.policy = rates.at_restart(policy, run_dir, node.restart_count())
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.recorder = recorder
        #: who this run is (`tgnb.train.ownership`): recorded in each checkpoint's marker;
        #: `protect` and `Checkpointer` add the seed, learning rate and model they know
        self.identity = ownership.identity(recorder.run if os.environ.get(node.RUN_ENV) else None)
        self._claim: ownership.Claim | None = None
        self.signal_received: tuple[int, float] | None = None
        self.drain_notice: tuple[str, dict[str, Any], float] | None = None
        self.stop_reason: str | None = None  # "signal" | "drain": a preemption
        self.resumed: ck.Checkpoint | None = None
        self.step_time_s: float | None = None
        self.saver: Saver | None = None
        self._trainer: Any = None
        self._adapter_only = False
        self._rng_at: str | None = None  # "epoch" | "step": when to restore the resumed RNG
        self._reported: set[str] = set()
        self._previous: dict[int, Any] = {}
        self._watcher: DrainWatcher | None = None
        self._step_began: float | None = None
        self._last_save_time = time.monotonic()
        if policy.on_signal:
            for sig in SIGNALS:
                with contextlib.suppress(ValueError):  # not the main thread
                    self._previous[sig] = signal.signal(sig, self._on_signal)
        if policy.watch_drain and int(os.environ.get("LOCAL_RANK", "0")) == 0:
            self._watcher = DrainWatcher(self._on_drain_notice, policy.drain_poll_seconds).start()

    # -- flags, set from a signal handler or the watcher thread, read at step boundaries -----------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signal_received is None:
            self.signal_received = (signum, time.time())

    def _on_drain_notice(self, source: str, details: dict[str, Any]) -> None:
        if self.drain_notice is None:
            self.drain_notice = (source, details, time.time())

    def own_signals(self) -> None:
        """Take SIGTERM and SIGUSR1 back from a framework that installed its own handlers over
        the guard's (Lightning's ends training before the guard saves); `close` still gives
        back the handlers found when the guard was made."""
        if self.policy.on_signal:
            for sig in SIGNALS:
                with contextlib.suppress(ValueError):  # not the main thread
                    signal.signal(sig, self._on_signal)

    def request_stop(self, reason: str = "signal") -> None:
        """Ask for checkpoint-and-exit at the next step boundary, as a signal or notice would."""
        if reason == "drain":
            self._on_drain_notice("request", {})
        else:
            self._on_signal(int(signal.SIGTERM), None)

    @property
    def last_checkpoint(self) -> ck.Checkpoint | None:
        return self.saver.last if self.saver and self.saver.last else self.resumed

    def stopped_line(self, step: int, managed: bool) -> str:
        """The line a program stopped for a preemption prints (stderr): where it checkpointed,
        and who starts it again (tgnb when it launched the run)."""
        last = self.last_checkpoint
        where = f" ({last.path})" if last is not None else ""
        again = "tgnb starts it again" if managed else "run it again to resume"
        return f"tgnb: stopped at step {step}, checkpointed{where}: {again}"

    # -- what the runner calls ---------------------------------------------------------------------
    def training_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`kwargs` with the settings the guard owns (`OWNED_ARGS`)."""
        out = {k: v for k, v in kwargs.items() if k != "save_steps"}
        return {**out, **_SETTINGS, "output_dir": str(self.ckpt_dir)}

    def batch_args(self, kwargs: dict[str, Any], world: int) -> dict[str, Any]:
        """`batch_args` for this run's checkpoints."""
        return batch_args(self.ckpt_dir, kwargs, world)

    def callbacks(self) -> list[Any]:
        """The trainer callbacks that implement the guard (`tgnb.train.callback.GuardCallback`)."""
        from tgnb.train.callback import GuardCallback

        return [GuardCallback(self)]

    def attach(self, trainer: Any) -> None:
        """Bind the trainer (every rank, at the same point: it makes the save process group)."""
        self._trainer = trainer
        if "peft" in sys.modules:  # a PEFT model cannot exist unless peft was imported
            from peft import PeftModel

            self._adapter_only = isinstance(trainer.model, PeftModel)
        self.saver = Saver(self.ckpt_dir, self.recorder, self.policy.keep_last)

    def resume_from(self) -> str | None:
        """The newest complete checkpoint's path (rank 0's choice, on every rank), or None."""
        choice: list[Any] = [None, None]
        if dcpio.rank() == 0:
            choice = self._choose()
        if dcpio.dist_up():
            import torch.distributed as dist

            dist.broadcast_object_list(choice, src=0)
        path, refusal = choice
        if refusal:
            raise CheckpointError(refusal)
        if path is None:
            return None
        ckpt = ck.read_marker(path)
        assert ckpt is not None
        self.resumed = ckpt
        if self.saver is not None:
            self.saver.last, self.saver.last_step = ckpt, ckpt.step
        self.recorder.event(
            RUN_RESUMED,
            f"resumed from {ckpt.name} at step {ckpt.step}",
            step=ckpt.step,
            restart_count=self.restart_count(),
            checkpoint=str(ckpt.path),
            world_size=dcpio.world(),
            saved_world_size=ckpt.meta.get("world_size"),
            samples=ckpt.meta.get("samples"),
        )
        return str(ckpt.path)

    def _choose(self) -> list[Any]:
        try:  # the directory is this run's while it lives (`tgnb.train.ownership`)
            if self._claim is None:
                self._claim = ownership.claim(self.ckpt_dir, self.identity)
        except CheckpointError as exc:
            return [None, str(exc)]
        rejected = 0
        for path in ck.checkpoint_dirs(self.ckpt_dir, real=False):  # a link is quarantined too
            ckpt, reason = ck.check(path)
            if ckpt is not None and not (reason := dcpio.probe(path, ckpt)):
                owner = ckpt.meta.get("owner")
                if other := ownership.check_owner(self.ckpt_dir, owner, self.identity):
                    return [None, other]
                return [str(ckpt.path), None]
            rejected += reason != ck.UNFINISHED  # a save that never finished lost nothing
            moved = ck.quarantine(path, reason)
            msg = f"checkpoint {path.name} rejected: {reason}; moved to {moved}"
            print(f"tgnb: {msg}", file=sys.stderr, flush=True)
            self.recorder.event(
                CHECKPOINT_REJECTED, msg, checkpoint=str(path), cause=reason, moved_to=str(moved)
            )
        if (rejected or ck.refused_before(self.ckpt_dir)) and not self.policy.allow_fresh_start:
            return [
                None,
                f"no complete checkpoint is left in {self.ckpt_dir} (see {ck.QUARANTINE}/); "
                "refusing to start again from step 0: set checkpoint.allow_fresh_start=true to do so",
            ]
        return [None, None]

    def restart_count(self) -> int:
        if any(os.environ.get(name, "").strip().isdigit() for name in node.RESTART_VARS):
            return node.restart_count()
        events = read_jsonl(self.run_dir / "events.jsonl")
        return 1 + sum(1 for ev in events if ev.reason == RUN_RESUMED)

    def finish(self, trainer: Any) -> int:
        """0 finished, `EXIT_PREEMPTED` stopped for a signal or drain notice, `EXIT_NO_SPACE`
        stopped by a full disk. Records ``RunExited``. Every rank calls it."""
        return self.finish_at(int(trainer.state.global_step), int(trainer.state.max_steps))

    def finish_at(self, step: int, max_steps: int) -> int:
        """`finish` for a run that stopped at `step` of `max_steps` (a Trainer or a loop)."""
        if self.saver is not None:
            self.saver.wait()
            # every rank exits alike, also when only rank 0's marker failed
            mine = [int(self.saver.failure is not None), int(self.saver.no_space)]
            failed, full = dcpio.any_rank(mine, group=self.saver.writer.group)
            if failed:
                self.saver.failed_elsewhere(bool(full))
        self.close()
        self._report_notices(step)
        failure = self.saver.failure if self.saver else None
        if failure is not None and not (self.saver and self.saver.no_space):
            raise CheckpointError(f"checkpoint failed: {failure}") from failure
        done = step >= max_steps and failure is None
        if done:
            code, reason = 0, "finished"
        elif failure is not None:
            code, reason = EXIT_NO_SPACE, "disk full"
        else:
            code, reason = (EXIT_PREEMPTED, "preempted") if self.stop_reason else (0, "finished")
        if code == EXIT_PREEMPTED and self.stop_reason == "drain":
            self._requeue()
        last = self.last_checkpoint
        with contextlib.suppress(OSError):
            self.recorder.event(
                RUN_EXITED,
                f"{reason} at step {step}",
                exit_reason=reason.replace(" ", "-"),
                exit_code=code,
                step=step,
                checkpoint_step=last.step if last else None,
            )
        print(f"tgnb: rank {dcpio.rank()} {reason} at step {step}", file=sys.stderr, flush=True)
        if dcpio.dist_up():
            import torch.distributed as dist

            dist.barrier()
        return code

    def stop_watcher(self) -> None:
        """Stop the drain watcher (the run is over: no notice can matter any more)."""
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def close(self) -> None:
        """Stop the drain watcher, give the signal handlers back, free the staging memory (after
        the save in flight, if any)."""
        if self.saver is not None and not self.saver.busy:
            self.saver.writer.close()
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous.clear()
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    # -- internals ---------------------------------------------------------------------------------
    def _requeue(self) -> None:
        """Under a user's own sbatch script, requeue the job after a drain notice. Under the
        script tgnb rendered (`node.REQUEUE_ENV` is ``script``) the script does, from the
        recovery policy: one place decides."""
        job = os.environ.get("SLURM_JOB_ID")
        if os.environ.get(node.REQUEUE_ENV) == "script":
            return
        if not (job and self.policy.requeue_on_drain and dcpio.rank() == 0):
            return
        self.recorder.event(RUN_REQUEUED, f"scontrol requeue {job}", job_id=job)
        try:
            subprocess.run(["scontrol", "requeue", job], capture_output=True, timeout=30)
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

    def _report_interval(self, every: int) -> None:
        """Once per start: the interval `checkpoint.auto` chose, and the rates behind it."""
        if "interval" in self._reported or not self.step_time_s:
            return
        self._reported.add("interval")
        p = self.policy
        seconds = every * self.step_time_s
        source = p.preemptions_source or f"{p.preemption_rate:g} preemptions per hour (the setting)"
        self.recorder.event(
            CHECKPOINT_INTERVAL,
            f"checkpoint every {every} steps ({seconds:.0f} s): {source}",
            every_steps=every,
            every_s=round(seconds, 3),
            preemptions_per_hour=p.preemption_rate,
            failures_per_hour=p.failures_per_hour,
            source="setting" if p.observed_preemptions_per_hour is None else "observed",
        )

    def _periodic_due(self, step: int) -> bool:
        p = self.policy
        last = self.saver.last_step if self.saver else 0
        if p.every_steps and step % p.every_steps == 0:
            return True
        if p.every_seconds and time.monotonic() - self._last_save_time >= p.every_seconds:
            return True
        if p.auto_interval and self.step_time_s and self.saver is not None:
            stall, write = self.saver.stall_s, self.saver.write_s
            if stall is None:  # before the first save: from the size of what is saved
                params = self._trainer.model.parameters()
                nbytes = sum(t.numel() * t.element_size() * 3 for t in params if t.requires_grad)
                stall = nbytes / _ASSUMED_STAGE_BPS
            write = (write or stall) if p.async_save else 0.0  # a sync save is never in flight
            notices = p.preemption_rate if p.on_signal or p.watch_drain else 0.0
            failures = p.failures_per_hour + p.preemption_rate - notices  # unseen: failures
            every = ck.young_daly_steps(self.step_time_s, stall, failures, write, notices)
            every = min(every, max(1, int(AUTO_MAX_SECONDS / self.step_time_s)))  # the bound
            self._report_interval(every)
            return step - last >= every
        return False

    def _meta(self, batch: int, step: int) -> dict[str, Any]:
        world = dcpio.world()
        return {
            "world_size": world,
            "global_batch": batch,
            "samples": step * batch,  # the data position, in global samples
            "adapter_only": self._adapter_only,
            "owner": self.identity,
        }

    def on_train_begin(self, args: Any, state: Any, dataloader: Any) -> None:
        if self.resumed is None:
            return
        dcpio.load(self.resumed.path, self._trainer, self._adapter_only)
        per_epoch = 1
        with contextlib.suppress(TypeError):
            n, ga = len(dataloader), int(args.gradient_accumulation_steps)
            per_epoch = max(n // ga + int(n % ga > 0), 1)
        # as the Trainer would: after skipping the data seen, or at the epoch's start if none
        self._rng_at = "step" if int(state.global_step) % per_epoch else "epoch"

    def on_epoch_begin(self) -> None:
        if self._rng_at == "epoch" and self.resumed is not None:
            dcpio.load_rng(self.resumed.path)
            self._rng_at = None

    def on_step_begin(self) -> None:
        if self._rng_at == "step" and self.resumed is not None:
            dcpio.load_rng(self.resumed.path)
        self._rng_at = None
        self._step_began = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any) -> None:
        batch = (
            int(args.per_device_train_batch_size)
            * dcpio.world()
            * int(args.gradient_accumulation_steps)
        )
        step, max_steps = int(state.global_step), int(state.max_steps)
        if self.step_boundary(step, max_steps, batch, dcpio.flags_device()):
            control.should_training_stop = True

    def step_boundary(self, step: int, max_steps: int, global_batch: int, device: Any) -> bool:
        """At the end of optimizer step `step` (every rank): agree on the flags, save what is due
        (`global_batch` goes into the marker; `device` holds the flags' collective, ``"cpu"``
        under gloo). True when training must stop now (preempted, or a save failed)."""
        now = time.monotonic()
        if self._step_began is not None:
            took = now - self._step_began
            self.step_time_s = (
                took if self.step_time_s is None else 0.8 * self.step_time_s + 0.2 * took
            )
        saver = self.saver
        assert saver is not None, "call CheckpointGuard.attach(trainer) before training"
        if saver.async_failed:
            saver.wait()  # it has ended: report it now
        flags = [
            int(self.signal_received is not None),
            int(self.drain_notice is not None),
            int(self._periodic_due(step)),
            int(saver.failure is not None),
            int(saver.no_space),
        ]
        flags = dcpio.any_rank(flags, device=device)
        signalled, drained, due, failed, full = flags
        if failed:  # on any rank: every rank stops (nothing more is written)
            saver.wait()
            saver.failed_elsewhere(bool(full))  # `finish` exits on the failure, not a reason
            return True
        final = step >= max_steps
        meta = self._meta(global_batch, step)
        if (signalled or drained) and not final:
            self.stop_reason = self.stop_reason or (
                "drain" if drained and not signalled else "signal"
            )
            if self.stop_reason == "drain" and self.drain_notice is None:
                self.drain_notice = ("peer", {}, time.time())
            if self.stop_reason == "signal" and self.signal_received is None:
                self.signal_received = (int(signal.SIGTERM), time.time())
            self._report_notices(step)
            saver.save(self._trainer, step, self.stop_reason, meta, sync=True)
            return True
        if final:
            saver.save(self._trainer, step, "final", meta, sync=True)
        elif due:
            saver.save(self._trainer, step, "periodic", meta, sync=not self.policy.async_save)
            self._last_save_time = time.monotonic()
        # a periodic save that failed stops every rank at the next boundary (agreed there); a
        # failed preemption or final save ends training now, and `finish` turns it into the exit
        return False
