"""A plain PyTorch or Accelerate loop on preemptible nodes, without a Trainer: `Checkpointer`.

::

    ckpt = tgnb.train.Checkpointer(model, opt, sched, max_steps=200, dir="out")
    ckpt.add_state("data", sampler)        # anything with state_dict() / load_state_dict()
    for step in ckpt.steps():              # from the saved step + 1; stops on a preemption
        loss = ...; loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        ckpt.log(loss=loss.item())         # this step's metrics row

It is the built-in runs' machinery, driven from a loop instead of Trainer callbacks:
`tgnb.train.preemption.CheckpointGuard` (the flags of SIGTERM, SIGUSR1 and a drain notice, agreed
by every rank at each step boundary; periodic saves by ``every_steps``, ``every_seconds`` or
``auto``; the resume choice and quarantine; the exit codes) and `tgnb.train.saving.Saver` (DCP
saves, asynchronous when periodic, synchronous on a notice and at the last step, sealed with the
marker last). Model and optimizer go through DCP's ``get_state_dict``/``set_state_dict`` (DDP,
FSDP2; resharded when the world size changed); the scheduler and the added states are JSON from
rank 0 (``scheduler.json``, ``loop.json``: plain values, the same on every rank); each rank's
RNG (torch, CUDA, numpy, Python) its own file. Once every rank has started ``torch.distributed``
(or with one process), build the Checkpointer at the same point on every rank.

Where, as for `tgnb.train.protect` (`tgnb.train.protect.run_context`): under tgnb the run
directory is ``$TGNB_RUN_DIR`` (the node contract, `tgnb.runs.node`); outside it, `dir`.
Checkpoints go in ``<dir>/checkpoints``, rows in ``metrics.jsonl``, events in ``events.jsonl``. The
policy: `checkpoint` (a `CheckpointPolicy` or a dict of its fields), unless launched: the launch's
wins (the cockpit set it), read from the run file ``$TGNB_CONFIG`` names (``$TGNB_CHECKPOINT``'s
keys over `checkpoint` where none is named: a job rendered before the run file).

At the end `steps` returns after the final save. On a preemption it exits the process with 75
(`Exit.PREEMPTED`), on a full disk with 74 (`Exit.NO_SPACE`); with ``exit=False`` it returns and
leaves the code in `exit_code`. Breaking out of the loop saves nothing.

``fault_tolerant=True`` (a launch with ``fault_tolerance="torchft"``, docs/replica-groups.md):
the process is one TorchFT replica group; `tgnb.train.ftloop` sets up TorchFT's Manager, gates
the optimizer's ``step()`` on the quorum's commit and makes `steps` follow the Manager's step (a
joining group heals from a live peer, no checkpoint load); one group writes the checkpoints.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tgnb.errors import CheckpointError, TrainConfigError
from tgnb.runs.ft import TORCHFT
from tgnb.runs.node import CHECKPOINTS, RUN_DIR_ENV, RUN_ENV, Exit
from tgnb.runs.policy import CheckpointPolicy
from tgnb.train import checkpoint as ck
from tgnb.train import dcpio, ftloop, ownership
from tgnb.train.order import global_batch_line
from tgnb.train.preemption import CheckpointGuard
from tgnb.train.protect import run_context
from tgnb.train.record import METRIC_COLUMNS, Recorder, number, run_failed, run_started
from tgnb.train.saving import no_space
from tgnb.train.tracker import open_trackers

__all__ = ["Checkpointer"]

#: The loop's own file in a checkpoint: its step and the added states.
LOOP_STATE = "loop.json"


def _plain(name: str, obj: Any) -> dict[str, Any]:
    state = obj.state_dict()
    try:
        json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise TrainConfigError(
            f"state '{name}': its state_dict() is not plain JSON ({exc}); return numbers, "
            "strings, lists and dicts (tensors belong in the model or optimizer)."
        ) from None
    return dict(state)


class Checkpointer:
    """Checkpoints, resumes and records a plain training loop (see the module docstring).

    `max_steps`: the optimizer steps of the whole run (`steps` yields 1..max_steps, from the
    resumed step + 1). `global_batch`: samples per step, recorded in each checkpoint (the data
    position); optional. `name`: the run's name in its events (default ``$TGNB_RUN``, or the
    directory's name). `report_to`: ``"wandb"``, ``"mlflow"`` or both: one tracker run across
    preemptions and restarts, with the metrics rows and tgnb's events (`tgnb.train.tracker`).
    `fault_tolerant`: train as a TorchFT replica group (the module docstring)."""

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        scheduler: Any = None,
        *,
        max_steps: int,
        dir: str | os.PathLike[str] | None = None,
        checkpoint: CheckpointPolicy | dict[str, Any] | None = None,
        states: Mapping[str, Any] | None = None,
        global_batch: int = 0,
        name: str | None = None,
        exit: bool = True,
        report_to: str | list[str] | None = None,
        fault_tolerant: bool = False,
    ) -> None:
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise TrainConfigError(f"max_steps must be a whole number >= 1, not {max_steps!r}.")
        if optimizer is None or not hasattr(optimizer, "param_groups"):
            raise TrainConfigError("Checkpointer needs the torch optimizer (optimizer=...).")
        if fault_tolerant:
            ftloop.check()
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dcpio.dist_up():
            raise TrainConfigError(
                "call torch.distributed.init_process_group() before making the Checkpointer "
                "(WORLD_SIZE is above 1): every rank takes part in its saves."
            )
        if not (os.environ.get(RUN_DIR_ENV) or dir):
            raise TrainConfigError(
                "Checkpointer needs a directory outside tgnb: Checkpointer(..., dir='out') "
                f"(under tgnb ${RUN_DIR_ENV} gives it)."
            )
        ctx = run_context(dir, checkpoint)  # as protect(): the launch's directory and policy win
        self.run_dir, self.policy, self.managed = ctx.run_dir, ctx.policy, ctx.managed
        self.max_steps = max_steps
        self.global_batch = int(global_batch)
        self.step = 0  # the last step completed (after a resume: the checkpoint's)
        self.exit_code: int | None = None
        self.resumed: ck.Checkpoint | None = None
        self._exit = exit
        self._states: dict[str, Any] = {}
        self._row: dict[str, Any] = {}
        self._started = False
        for key, obj in (states or {}).items():
            self.add_state(key, obj)
        self.state = dcpio.State(model, optimizer, scheduler, write=self._write)
        self.recorder = Recorder(self.run_dir, name or ctx.name)
        self.trackers = open_trackers(self.recorder, report_to, metrics=True)
        self.guard = CheckpointGuard(self.policy, self.run_dir, self.recorder)
        lr = number(optimizer.param_groups[0].get("lr")) if optimizer.param_groups else None
        # tgnb's name for the run ($TGNB_RUN) or the user's own; else none: the folder's name is
        # not an identity (a run directory copied elsewhere is the same run)
        named = self.recorder.run if os.environ.get(RUN_ENV) or name else None
        self.guard.identity = ownership.identity(named, learning_rate=lr)
        self.guard.attach(self.state)  # every rank, at the same point: the saves' process group
        self.ft = ftloop.FaultTolerant(self.state, self._states) if fault_tolerant else None
        self.guard.shared = fault_tolerant  # the replica groups share the run's directory

    @property
    def checkpoint_dir(self) -> Path:
        return self.run_dir / CHECKPOINTS

    def add_state(self, name: str, obj: Any) -> None:
        """Save and restore `obj` (a sampler, a data position, a counter: anything with
        ``state_dict()`` returning plain JSON values and ``load_state_dict(d)``) with the run."""
        if self._started:
            raise TrainConfigError(f"add_state('{name}', ...) comes before steps().")
        if not (callable(getattr(obj, "state_dict", None)) and hasattr(obj, "load_state_dict")):
            raise TrainConfigError(
                f"state '{name}' needs state_dict() and load_state_dict(); "
                f"{type(obj).__name__} has not both."
            )
        _plain(name, obj)
        self._states[name] = obj

    def log(self, **values: Any) -> None:
        """Add `values` (numbers, 0-d tensors) to this step's ``metrics.jsonl`` row, written when
        the step ends (rank 0 writes; the learning rate is added unless given). The row's own
        columns (`METRIC_COLUMNS`: ``step``, ``time``) are tgnb's: refused here, at once."""
        if taken := [key for key in values if key in METRIC_COLUMNS]:
            raise TrainConfigError(
                f"Checkpointer.log({taken[0]}=...): {taken[0]!r} is a column tgnb writes in "
                f"every metrics row (the loop's step and the time); log it under another name, "
                f"e.g. log(my_{taken[0]}=...)"
            )
        for key, value in values.items():  # a loss tensor's graph is not kept
            self._row[key] = value.detach() if isinstance(value, torch.Tensor) else value

    def request_stop(self) -> None:
        """Checkpoint and stop at the next step boundary, as SIGTERM would (exit 75)."""
        self.guard.stops.request("signal")

    def steps(self) -> Iterator[int]:
        """Resume (model, optimizer, scheduler, added states, RNG), then yield each step; save
        what the policy asks at each step's end, and stop on a notice. See the module docstring."""
        if self._started:
            raise TrainConfigError("steps() runs once per Checkpointer; make a new one to rerun.")
        self._started = True
        try:
            self._begin()
            while (step := self._next()) <= self.max_steps:
                self.guard.schedule.step_began()
                yield step
                if self.ft is not None and not self.ft.end_step(step):
                    self._row = {}  # not committed: tried again under the same number
                    continue
                self.step = step
                self._flush_row()
                device = dcpio.flags_device()
                if self.ft is not None:  # one group saves; none on a stop while a peer lives
                    self.guard.saves, self.guard.peers = self.ft.writer, not self.ft.alone
                if self.guard.step_boundary(step, self.max_steps, self.global_batch, device):
                    break
            code = self.guard.finish_at(self.step, self.max_steps)
        except GeneratorExit:  # the loop was left early: nothing to save
            self._close()
            raise
        except OSError as exc:
            self._close()
            if not no_space(exc):
                run_failed(self.recorder, exc, self.step)
                raise
            print(f"tgnb: disk full under {self.run_dir}: {exc}", file=sys.stderr, flush=True)
            code = int(Exit.NO_SPACE)
        except BaseException as exc:
            self._close()
            if not isinstance(exc, SystemExit | KeyboardInterrupt):  # an exit is no failure
                run_failed(self.recorder, exc, self.step)
            raise
        self.exit_code = int(code)
        if self.ft is not None:
            self.ft.shutdown()  # its heartbeats stop now: out after the lighthouse's timeout
        if code and self.ft is not None and self.guard.peers:
            line = (
                f"tgnb: replica group {self.ft.group} left at step {self.step}; its peers train on"
            )
            if dcpio.rank() == 0:  # once per group, not once per rank of it
                print(line, file=sys.stderr)
        elif code:
            print(self.guard.stopped_line(self.step, self.managed), file=sys.stderr)
        if code and self._exit:
            self.recorder.close()
            sys.stdout.flush()
            if dist.is_initialized():  # else gloo's threads can abort the exit (SIGABRT)
                dist.destroy_process_group()
            sys.exit(code)

    # -- internals ---------------------------------------------------------------------------------
    def _close(self) -> None:
        """Training ended early (left, a full disk, an error): the guard's handlers back, and
        the Manager down at once (its heartbeats stop: the peers wait the lighthouse's
        heartbeat timeout at most)."""
        self.guard.close()
        if self.ft is not None:
            self.ft.shutdown()

    def _begin(self) -> None:
        model = getattr(self.state.model, "module", self.state.model)  # under DDP
        run_started(
            self.recorder,
            algorithm="loop",
            model=type(model).__name__,
            max_steps=self.max_steps,
            world_size=dcpio.world(),
            pid=os.getpid(),
        )
        if self.ft is None:
            self._resume()

    def _next(self) -> int:
        """The step to train next; under replica groups after this step's quorum."""
        if self.ft is None:
            return self.step + 1
        step = self.ft.begin_step()
        if self.ft.fresh():  # no participant has trained a step: a whole-run loss (or a start)
            saved = self._resume()
            if saved is not None:
                self.ft.resumed(self.step, saved)
                step = self.step + 1
        self.step = step - 1  # the quorum's committed step (a healed group: its peer's)
        self.ft.active = True  # its optimizer.step() commits with the quorum
        return step

    def _resume(self) -> dict[str, Any] | None:
        """Load the newest complete checkpoint, if any; its loop state (None without one)."""
        if self.guard.resume_from() is None:
            return None
        found = self.guard.resumed
        assert found is not None
        dcpio.load(found.path, self.state, bool(found.meta.get("adapter_only", False)))
        try:
            saved = json.loads((found.path / LOOP_STATE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise CheckpointError(
                f"{found.path} holds no {LOOP_STATE}: it was not saved by a Checkpointer loop; "
                "give this loop a directory of its own."
            ) from None
        kept = saved.get("states", {})
        for key, obj in self._states.items():
            if key not in kept:
                raise CheckpointError(
                    f"{found.path} holds no state '{key}' (it holds {sorted(kept) or 'none'}): "
                    "add the same states as the run that saved it."
                )
            obj.load_state_dict(kept[key])
        dcpio.load_rng(found.path)
        self.step, self.resumed = found.step, found
        saved_world = int(found.meta.get("world_size") or dcpio.world())
        if saved_world != dcpio.world() and dcpio.rank() == 0:  # the global batch changes
            batch = int(found.meta.get("global_batch") or 0) // saved_world
            print(global_batch_line(saved_world, dcpio.world(), batch), file=sys.stderr, flush=True)
        return dict(saved)

    def _write(self, path: Path) -> None:  # rank 0, in every save
        states = {key: _plain(key, obj) for key, obj in self._states.items()}
        loop: dict[str, Any] = {"step": self.step, "states": states}
        if self.ft is not None:  # TorchFT's Manager state goes with a checkpoint (its docs)
            loop[TORCHFT] = self.ft.own_state()
        dcpio.write_json(path / LOOP_STATE, loop)

    def _flush_row(self) -> None:
        row, self._row = self._row, {}
        if self.ft is not None and not self.ft.writer:
            return  # the quorum's writer records the step (once)
        out = {key: n for key, value in row.items() if (n := number(value)) is not None}
        groups = getattr(self.state.optimizer, "param_groups", None)
        if groups and "learning_rate" not in out:
            lr = number(groups[0].get("lr"))
            if lr is not None:
                out["learning_rate"] = lr
        self.recorder.metric(self.step, **out)
