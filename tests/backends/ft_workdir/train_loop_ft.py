"""The loop of `train_ft.py` written with tgnb's Checkpointer instead of TorchFT's own API:
``Checkpointer(..., fault_tolerant=True)`` sets up the Manager, gates the optimizer's step on the
quorum's commit and follows the Manager's step. Each step prints one JSON line: its group, the
step, the groups in its quorum, whether it was committed, and the time. ``FT_STEPS``: the steps;
``FT_STEP_S``: the compute time of a step (a sleep)."""

import json
import os
import time

import torch
from torch import nn, optim

import tgnb.train

STEPS = int(os.environ.get("FT_STEPS", "200"))
STEP_S = float(os.environ.get("FT_STEP_S", "0.05"))
GROUP = int(os.environ.get("REPLICA_GROUP_ID", "0"))


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = optim.SGD(model.parameters(), lr=0.01)
    sched = optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)
    ckpt = tgnb.train.Checkpointer(
        model, opt, sched, max_steps=STEPS, dir="out", fault_tolerant=True
    )
    gen = torch.Generator().manual_seed(GROUP)
    print(json.dumps({"group": GROUP, "started": time.time()}), flush=True)
    for step in ckpt.steps():
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        time.sleep(STEP_S)  # the rest of a step's compute
        opt.step()  # commits when the quorum agrees
        sched.step()
        ckpt.log(loss=loss.item())
        line = {
            "group": GROUP,
            "step": step,
            "committed": ckpt.ft.committed if ckpt.ft else True,
            "participants": ckpt.ft.manager.num_participants() if ckpt.ft else 1,
            "t": time.time(),
        }
        print(json.dumps(line), flush=True)
    print(json.dumps({"group": GROUP, "done": ckpt.step, "t": time.time()}), flush=True)


if __name__ == "__main__":
    main()
