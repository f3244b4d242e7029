"""A plain loop as a TorchFT replica group: `tgnb.train.Checkpointer(..., fault_tolerant=True)`.

Under a launch with ``fault_tolerance="torchft"`` (`tgnb.runs.ft`) each node is a replica group;
this sets up what TorchFT's docs otherwise have the program write itself, around the loop's own
model, optimizer and scheduler:

- TorchFT's ``Manager`` (ProcessGroupGloo on CPU, ProcessGroupNCCL when the model is on CUDA, as
  TorchFT's examples), its replica id ``group_<REPLICA_GROUP_ID>``; the state a live peer sends a
  joining group is the model, optimizer, scheduler and the Checkpointer's added states (the loop's
  step is the Manager's, sent with them). The quorum is synchronous (``use_async_quorum=False``):
  a joining group heals before its forward pass, so each step it trains is the step it yields.
- The optimizer's ``step()`` is gated in place (as a torch LR scheduler wraps it): it averages
  each gradient across the quorum with ``Manager.allreduce``, waited on, then steps only when
  ``Manager.should_commit()`` agrees; on a step not committed the scheduler's state and the
  learning rates are put back as they were when the step began (the scheduler is not patched:
  its ``state_dict()`` holds its attributes). Not
  ``torchft.DistributedDataParallel``: in torchft 0.2.0 its comm hook fails ``assert fut._fut``
  when a peer dies during the allreduce, so a survivor would crash instead of skipping the step;
  the Manager's allreduce reports the error and the step is just not committed. A DDP or FSDP
  model inside the group (torch's own, over the group's ranks) is unchanged.
- `FaultTolerant.begin_step` starts each step's quorum and returns the step to train: the
  Manager's committed step + 1 (a healed group goes on at its peer's step; a step that was not
  committed is tried again under the same number, so each step is trained and recorded once).
- Checkpoints: the periodic, final and metrics rows are written by the quorum's first participant
  only (``participating_rank() == 0``: TorchFT orders the quorum by replica id, so group 0 while
  it is in it, else the lowest group alive). Every participant sees the same quorum, so exactly
  one group writes each step without any other coordination, and the writer changes by itself
  when it is preempted (`tgnb.runs.ft.CHECKPOINT_GROUP`). A group stopped by a notice while a
  peer is alive leaves without a save (the peer holds the state); alone, it saves as any loop.
  A checkpoint is loaded only at a group's first quorum when no participant has trained a step
  (a whole-run loss or a fresh start): every such participant loads the same newest checkpoint.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.runs import ft
from tgnb.runs.ftcheck import INSTALL

__all__ = ["FaultTolerant", "check"]


def check() -> None:
    """Refuse ``fault_tolerant=True`` where it cannot run, in one line naming the fix."""
    if importlib.util.find_spec(ft.TORCHFT) is None:
        raise TrainConfigError(
            f"Checkpointer(fault_tolerant=True) needs TorchFT, which is not installed: {INSTALL}"
        )
    if not os.environ.get(ft.LIGHTHOUSE_ENV):
        raise TrainConfigError(
            f"Checkpointer(fault_tolerant=True) needs a TorchFT lighthouse: launch with "
            f"fault_tolerance='torchft' (tgnb starts one), or start torchft_lighthouse and set "
            f"{ft.LIGHTHOUSE_ENV}=http://HOST:PORT and {ft.REPLICA_GROUP_ENV} (0, 1, ...)"
        )


def _module(model: Any) -> Any:
    return getattr(model, "module", model)  # under DDP


def _timeout() -> timedelta:
    raw = os.environ.get(ft.TIMEOUT_ENV, "")
    return timedelta(seconds=int(raw) if raw.isdigit() else ft.TIMEOUT_S)


class FaultTolerant:
    """The Manager and the gated optimizer of one replica group (see the module docstring).
    `state`: the Checkpointer's `tgnb.train.dcpio.State`; `states`: its added states (the same
    dict, filled by ``add_state``)."""

    def __init__(self, state: Any, states: Mapping[str, Any]) -> None:
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        self.state, self.states = state, states
        self.group = int(os.environ.get(ft.REPLICA_GROUP_ENV, "0"))
        timeout = _timeout()
        params = list(_module(state.model).parameters())
        cuda = bool(params) and params[0].is_cuda
        pg = ProcessGroupNCCL(timeout=timeout) if cuda else ProcessGroupGloo(timeout=timeout)
        where: dict[str, Any] = {}
        if "MASTER_ADDR" not in os.environ and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            # one process without torchrun: the group's store (torchrun's otherwise) is ours. Its
            # address goes to the other groups in the quorum: this host's name as torchrun gives
            # it (getfqdn), never a loopback address another host would take for itself
            from torch.distributed import TCPStore

            host = socket.getfqdn()
            self._store = TCPStore(host, 0, is_master=True, wait_for_workers=False)
            where = {"store_addr": host, "store_port": self._store.port}
            where.update(rank=0, world_size=1)
        self.manager = Manager(
            pg=pg,
            min_replica_size=1,
            load_state_dict=self._load,
            state_dict=self._save,
            use_async_quorum=False,
            replica_id=f"group_{self.group}",
            timeout=timeout,
            **where,
        )
        self.active = False  # the user's step runs (outside it, as in DCP's load, not gated)
        self.stepped = False  # optimizer.step() ran in this step
        self.committed = False  # ... and the quorum committed it
        self.first = True  # before the first quorum
        self.down = False  # out of the quorum (`shutdown`)
        self.writer = False  # this group writes this step's checkpoint and row
        self.alone = True  # no other group in this step's quorum
        self._sched: tuple[dict[str, Any], list[Any]] | None = None
        self._gate(state.optimizer)

    # -- what the Checkpointer calls ---------------------------------------------------------------
    def begin_step(self) -> int:
        """Start this step's quorum (a joining group heals from a live peer here) and return the
        step to train: the Manager's committed step + 1."""
        self.stepped = self.committed = False
        self.manager.start_quorum()
        s = self.state
        if s.scheduler is not None:  # after a heal: the peer's
            lrs = [g.get("lr") for g in s.optimizer.param_groups]
            self._sched = (copy.deepcopy(s.scheduler.state_dict()), lrs)
        self.writer = self.manager.participating_rank() == 0
        self.alone = self.manager.num_participants() <= 1
        return self.manager.current_step() + 1

    def fresh(self) -> bool:
        """True once, at the group's first quorum when no participant has trained a step: the
        only time a checkpoint is loaded (a whole-run loss; else a live peer's state is healed)."""
        first, self.first = self.first, False
        return first and self.manager.current_step() == 0

    def resumed(self, step: int, saved: Mapping[str, Any]) -> None:
        """The Manager goes on from a loaded checkpoint's `step` (its own state saved beside)."""
        own = dict(saved.get(ft.TORCHFT) or {})
        self.manager.load_state_dict(
            {"step": step, "batches_committed": int(own.get("batches_committed", 0))}
        )

    def end_step(self, step: int) -> bool:
        """Whether step `step` was committed (a step not committed is tried again)."""
        self.active = False
        if not self.stepped:
            raise TrainConfigError(
                f"step {step} ended without optimizer.step(): with fault_tolerant=True each step "
                "of steps() calls the optimizer's step() once (it commits with the quorum)"
            )
        if not self.committed and self._sched is not None:  # the schedule did not step either
            saved, lrs = self._sched
            self.state.scheduler.load_state_dict(saved)
            for group, lr in zip(self.state.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
        return self.committed

    def own_state(self) -> dict[str, int]:
        return dict(self.manager.state_dict())

    def shutdown(self) -> None:
        """Leave now, once: this group's Manager and its heartbeats stop. TorchFT 0.2.0's
        lighthouse has no call to leave, so the peers' next quorum forms once its heartbeat
        timeout has passed without this group (`tgnb.runs.ft`'s ``TGNB_FT_HEARTBEAT_TIMEOUT_MS``)."""
        if not self.down:
            self.down = True
            self.manager.shutdown(wait=False)

    # -- internals ---------------------------------------------------------------------------------
    def _gate(self, optimizer: Any) -> None:
        step = optimizer.step

        def gated(*args: Any, **kwargs: Any) -> Any:
            if not self.active:  # DCP's load initialises the optimizer's state with a step
                return step(*args, **kwargs)
            return self._commit(optimizer, step, args, kwargs)

        optimizer.step = gated

    def _commit(self, optimizer: Any, step: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if self.stepped:
            raise TrainConfigError(
                "optimizer.step() ran twice in one step: with fault_tolerant=True each step of "
                "steps() is one optimizer step (accumulate gradients before it)"
            )
        self.stepped = True
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        works = [self.manager.allreduce(grad) for grad in grads]
        for work in works:
            work.wait()  # False when a peer failed: the Manager then does not commit
        self.committed = bool(self.manager.should_commit())
        return step(*args, **kwargs) if self.committed else None

    def _save(self) -> dict[str, Any]:
        s = self.state
        out: dict[str, Any] = {
            "model": _module(s.model).state_dict(),
            "optimizer": s.optimizer.state_dict(),
            "states": {key: obj.state_dict() for key, obj in self.states.items()},
        }
        if s.scheduler is not None:
            out["scheduler"] = s.scheduler.state_dict()
        return out

    def _load(self, sd: dict[str, Any]) -> None:
        s = self.state
        _module(s.model).load_state_dict(sd["model"])
        s.optimizer.load_state_dict(sd["optimizer"])
        if s.scheduler is not None and "scheduler" in sd:
            s.scheduler.load_state_dict(sd["scheduler"])
        for key, obj in self.states.items():
            if key in sd["states"]:
                obj.load_state_dict(sd["states"][key])
