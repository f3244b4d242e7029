"""Checkpoint on preemption, periodically, and at the end; resume from the newest complete checkpoint.

`CheckpointGuard` binds three parts, each usable alone, to a `tgnb.train.saving.Saver`:

- `tgnb.train.stops.StopSignals`: SIGTERM / SIGUSR1 / a drain notice -> "stop requested" (flags);
- `tgnb.train.schedule.CheckpointSchedule`: when the next periodic save is due (``every_steps``,
  ``every_seconds``, or ``auto``: Young/Daly on the measured *stall* and write time of a save and
  the preemption estimate);
- `tgnb.train.callback.GuardCallback`: the ``TrainerCallback`` a Trainer drives it with
  (`tgnb.train.protect`); `tgnb.train.Checkpointer` and the Lightning callback call
  `step_boundary` from their own hooks instead.

At every optimizer-step boundary (`step_boundary`) the flags of all ranks (stop requested, save
due, save failed) are combined with one ``all_reduce(MAX)``, so every rank decides the same thing
at the same step. A stop: the save in flight is let finish, this step is saved synchronously and
sealed, training stops, and `finish` returns `EXIT_PREEMPTED` (75) -- under Slurm after a drain
notice it first requeues its own job. Periodic saves are asynchronous; the last step is saved
synchronously (with the Trainer's own model export beside the DCP state). At a restart the
preemption rate ``auto`` weighs is the launch's estimate updated with the run's own preemptions
since (`tgnb.train.rates`; the local engine re-reads the cluster instead, and that update is then
a no-op).

Resume (`resume_from`): rank 0 verifies the checkpoints newest first (sizes and checksums, then
what loading reads: `dcpio.probe`); one that fails is reported (``CheckpointRejected``, a log line
naming the file and the reason) and moved into ``checkpoints/quarantine``. When checkpoints
existed but none is complete the run refuses to start again from step 0 (`CheckpointError`)
unless ``checkpoint.allow_fresh_start`` is set. Every rank resumes from rank 0's choice.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tgnb.errors import CheckpointError
from tgnb.events import CHECKPOINT_REJECTED, RUN_EXITED, RUN_REQUEUED, RUN_RESUMED, read_jsonl
from tgnb.runs import node
from tgnb.runs.policy import CheckpointPolicy
from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck
from tgnb.train import dcpio, ownership, rates
from tgnb.train.record import Recorder
from tgnb.train.saving import Saver
from tgnb.train.schedule import CheckpointSchedule
from tgnb.train.stops import StopSignals

__all__ = ["EXIT_PREEMPTED", "CheckpointGuard"]


class CheckpointGuard:
    """Checkpoint-and-exit on SIGTERM or a drain notice, periodic and final checkpoints, resume:
    `stops` (a `StopSignals`) and `schedule` (a `CheckpointSchedule`) bound to a `Saver`."""

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
        self.stop_reason: str | None = None  # "signal" | "drain": a preemption
        self.began = time.time()  # this attempt's start (`_budget_stop`)
        self.resumed: ck.Checkpoint | None = None
        self.saver: Saver | None = None
        #: what is saved: a Trainer, or a `dcpio.State` (`attach`)
        self.trainer: Any = None
        self.adapter_only = False
        self.schedule = CheckpointSchedule(self.policy, recorder)
        self.stops = StopSignals.for_policy(policy)
        # replica groups (`tgnb.train.ftloop`): one run's several processes share the directory
        # (no lock: the identity still guards it); `saves` False: another group writes this
        # boundary's periodic and final saves; `peers` True: a live group holds this state, and a
        # stop leaves without a save
        self.shared = False
        self.saves = True
        self.peers = False

    @property
    def last_checkpoint(self) -> ck.Checkpoint | None:
        return self.saver.last if self.saver and self.saver.last else self.resumed

    def stopped_line(self, step: int, managed: bool) -> str:
        """The line a program stopped for a preemption prints (stderr): where it checkpointed,
        and who starts it again (tgnb when it launched the run)."""
        last = self.last_checkpoint
        where = f" ({last.path})" if last is not None else ""
        again = "tgnb starts it again" if managed else "run it again to resume"
        if managed and self._budget_stop():
            return f"tgnb: stopped at the run's budget at step {step}, checkpointed{where}"
        return f"tgnb: stopped at step {step}, checkpointed{where}: {again}"

    # -- what the runner calls ---------------------------------------------------------------------
    def attach(self, trainer: Any) -> None:
        """Bind the trainer (every rank, at the same point: it makes the save process group)."""
        self.trainer = trainer
        if "peft" in sys.modules:  # a PEFT model cannot exist unless peft was imported
            from peft import PeftModel

            self.adapter_only = isinstance(trainer.model, PeftModel)
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
            if self._claim is None and not self.shared:
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
        """0 finished, `EXIT_PREEMPTED` stopped for a signal or drain notice, `Exit.NO_SPACE` (74)
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
        self.stops.report(self.recorder, step)
        failure = self.saver.failure if self.saver else None
        if failure is not None and not (self.saver and self.saver.no_space):
            raise CheckpointError(f"checkpoint failed: {failure}") from failure
        done = step >= max_steps and failure is None
        if done:
            code, reason = 0, "finished"
        elif failure is not None:
            code, reason = int(node.Exit.NO_SPACE), "disk full"
        else:
            code, reason = (EXIT_PREEMPTED, "preempted") if self.stop_reason else (0, "finished")
        if code == EXIT_PREEMPTED and self.stop_reason == "signal" and self._budget_stop():
            reason = "stopped at the budget"  # the SIGTERM was the budget's, not a preemption
        if code == EXIT_PREEMPTED and self.stop_reason == "drain":
            self._requeue()
        last = self.last_checkpoint
        with contextlib.suppress(OSError):
            self.recorder.event(
                RUN_EXITED,
                f"{reason} at step {step}",
                exit_reason="budget" if reason.endswith("budget") else reason.replace(" ", "-"),
                exit_code=code,
                step=step,
                checkpoint_step=last.step if last else None,
            )
        print(f"tgnb: rank {dcpio.rank()} {reason} at step {step}", file=sys.stderr, flush=True)
        if dcpio.dist_up():
            import torch.distributed as dist

            dist.barrier()
        return code

    def close(self) -> None:
        """Stop the drain watcher, give the signal handlers back, free the staging memory (after
        the save in flight, if any)."""
        if self.saver is not None and not self.saver.busy:
            self.saver.writer.close()
        self.stops.close()
        if self._claim is not None:
            self._claim.release()
            self._claim = None

    # -- internals ---------------------------------------------------------------------------------
    def _budget_stop(self) -> bool:
        """Whether this attempt's SIGTERM came from the run's budget (`tgnb.runs.budget`)."""
        from tgnb.runs.budget import stopped_since

        try:
            return stopped_since(self.run_dir, self.began)
        except OSError:
            return False

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

    def state_bytes(self) -> int:
        """What a save copies before it lets training go on: the trainable parameters, with
        the optimizer's two moments each (the schedule's stall before the first save)."""
        params = self.trainer.model.parameters()
        return sum(t.numel() * t.element_size() * 3 for t in params if t.requires_grad)

    def periodic_due(self, step: int) -> bool:
        """Whether the schedule asks for a periodic save at the end of `step` (this rank)."""
        saver = self.saver
        assert saver is not None, "call CheckpointGuard.attach(trainer) before training"
        return self.schedule.due(
            step, saver.last_step, saver.stall_s, saver.write_s, self.state_bytes
        )

    def _meta(self, batch: int, step: int) -> dict[str, Any]:
        world = dcpio.world()
        return {
            "world_size": world,
            "global_batch": batch,
            "samples": step * batch,  # the data position, in global samples
            "adapter_only": self.adapter_only,
            "owner": self.identity,
        }

    def step_boundary(self, step: int, max_steps: int, global_batch: int, device: Any) -> bool:
        """At the end of optimizer step `step` (every rank): agree on the flags, save what is due
        (`global_batch` goes into the marker; `device` holds the flags' collective, ``"cpu"``
        under gloo). True when training must stop now (preempted, or a save failed)."""
        self.schedule.step_ended()
        saver = self.saver
        assert saver is not None, "call CheckpointGuard.attach(trainer) before training"
        if saver.async_failed:
            saver.wait()  # it has ended: report it now
        stops = self.stops
        flags = [
            int(stops.signal_received is not None),
            int(stops.drain_notice is not None),
            int(self.saves and self.periodic_due(step)),
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
            if self.stop_reason == "drain" and stops.drain_notice is None:
                stops.request("drain", source="peer")
            if self.stop_reason == "signal" and stops.signal_received is None:
                stops.request("signal")
            stops.report(self.recorder, step)
            if not self.peers:
                saver.save(self.trainer, step, self.stop_reason, meta, sync=True)
            return True
        if final and self.saves:
            saver.save(self.trainer, step, "final", meta, sync=True)
        elif due:
            saver.save(self.trainer, step, "periodic", meta, sync=not self.policy.async_save)
            self.schedule.saved()
        # a periodic save that failed stops every rank at the next boundary (agreed there); a
        # failed preemption or final save ends training now, and `finish` turns it into the exit
        return False
