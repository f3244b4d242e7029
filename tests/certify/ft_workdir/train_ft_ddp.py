"""A broken fault-tolerant program for `tgnb certify` (tests/certify/test_certify_groups.py): the
loop of tests/backends/ft_workdir/train_ft.py with ``torchft.DistributedDataParallel`` (its comm
hook) instead of the Manager's allreduce waited on. In torchft 0.2.0 the hook fails ``assert
fut._fut`` when a peer dies during the step's allreduce, so the survivor crashes instead of
skipping the step: both groups start again from step 0. Never imports tgnb. ``FT_STEPS``: the
steps; ``FT_STEP_S``: the compute time of a step (a sleep, between the quorum and the
allreduce)."""

import json
import os
import time
from datetime import timedelta

import torch
from torch import nn, optim
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

STEPS = int(os.environ.get("FT_STEPS", "200"))
STEP_S = float(os.environ.get("FT_STEP_S", "0.05"))
GROUP = int(os.environ.get("REPLICA_GROUP_ID", "0"))


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
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    gen = torch.Generator().manual_seed(GROUP)
    print(json.dumps({"group": GROUP, "started": time.time()}), flush=True)
    while manager.current_step() < STEPS:
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        time.sleep(STEP_S)
        ddp(x).pow(2).mean().backward()
        opt.step()
        print(json.dumps({"group": GROUP, "step": manager.current_step()}), flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
