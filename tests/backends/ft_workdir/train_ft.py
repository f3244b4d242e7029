"""A data-parallel loop on TorchFT's own API (Manager, Optimizer, ProcessGroupGloo, the Manager's
fault-tolerant allreduce of each gradient), as TorchFT's docs use it, with nothing of tgnb: the program of a fault-tolerant run's replica groups
in tgnb's tests and bench (`tests/backends/local/test_replica_groups.py`, `bench/fault_tolerance.py`).
Each step prints one JSON line to stdout: its group, the step after it, the groups in its quorum and
the time. ``FT_STEPS``: the steps to train; ``FT_STEP_S``: the compute time of a step (a sleep);
``FT_UNTIL`` (a test's knob): a file that, once a test writes a step into it, ends training at that
step instead (the same number for every group, so they stop in the same quorum step).

Not `torchft.DistributedDataParallel`: in torchft 0.2.0 its comm hook fails an ``assert fut._fut``
when a peer dies during the allreduce (`_ManagedWork.wait` reports the error before it sets up the
future the hook returns), so a survivor crashes instead of skipping the step; the Manager's
allreduce, waited on here, reports the error and the step is not committed, as TorchFT intends."""

import json
import os
import sys
import time
from datetime import timedelta

import torch
from torch import nn, optim
from torchft import Manager, Optimizer, ProcessGroupGloo

STEPS = int(os.environ.get("FT_STEPS", "200"))
STEP_S = float(os.environ.get("FT_STEP_S", "0.05"))  # compute time of one step (a sleep)
GROUP = int(os.environ.get("REPLICA_GROUP_ID", "0"))
UNTIL = os.environ.get("FT_UNTIL", "")


def last_step() -> int:
    """`STEPS`, or the step a test wrote into ``FT_UNTIL``'s file (read at each step)."""
    try:
        with open(UNTIL, encoding="utf-8") as f:
            return min(STEPS, int(f.read()))
    except (OSError, ValueError):  # no knob, not written yet, or written halfway
        return STEPS


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    inner = optim.SGD(model.parameters(), lr=0.01)

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"group_{GROUP}",
        timeout=timedelta(seconds=10),
    )
    opt = Optimizer(manager, inner)
    gen = torch.Generator().manual_seed(GROUP)
    started = time.time()
    print(json.dumps({"group": GROUP, "started": started}), flush=True)
    while manager.current_step() < last_step():
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()  # starts the quorum
        loss = model(x).pow(2).mean()
        loss.backward()
        time.sleep(STEP_S)  # the rest of a step's compute
        works = [manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None]
        for work in works:
            work.wait()  # False when a peer failed: the step is then not committed
        opt.step()  # commits when the quorum agrees
        line = {
            "group": GROUP,
            "step": manager.current_step(),
            "participants": manager.num_participants(),
            "t": time.time(),
        }
        print(json.dumps(line), flush=True)
    print(
        json.dumps({"group": GROUP, "done": manager.current_step(), "t": time.time()}), flush=True
    )
    manager.shutdown()


if __name__ == "__main__":
    sys.exit(main())
