"""A plain PyTorch loop with the Checkpointer, tiny; `--defect` breaks it one way:
``data`` (the data position not added), ``rng`` (noise from a generator of its own, not saved),
``exit0`` (its own SIGTERM handler exits 0), ``nohook`` (no Checkpointer at all)."""

import argparse
import json
import signal
import sys
import time

import torch

import tgnb.train

p = argparse.ArgumentParser()
p.add_argument("--max-steps", type=int, default=30)
p.add_argument("--defect", default="none")
p.add_argument("--step-s", type=float, default=0.05)  # a step's time, as a real one has
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(64, 4)
y = x.sum(dim=1, keepdim=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
own = torch.Generator().manual_seed(1)


class Position:
    """Where in the shuffled data the loop is."""

    def __init__(self) -> None:
        self.i = 0
        self.order = torch.randperm(64, generator=torch.Generator().manual_seed(2)).tolist()

    def next(self) -> list[int]:
        batch = [self.order[(self.i + k) % 64] for k in range(8)]
        self.i += 8
        return batch

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, d: dict) -> None:
        self.i = d["i"]


def step(pos: Position) -> float:
    idx = pos.next()
    gen = own if a.defect == "rng" else None
    noise = 0.01 * torch.randn(8, 1, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx] + noise)
    loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()
    time.sleep(a.step_s)
    return loss.item()


pos = Position()
if a.defect == "nohook":
    for s in range(1, a.max_steps + 1):
        print(json.dumps({"step": s, "loss": step(pos)}), flush=True)
    sys.exit(0)
ckpt = tgnb.train.Checkpointer(model, opt, sched, max_steps=a.max_steps, dir="out")
if a.defect != "data":
    ckpt.add_state("data", pos)
if a.defect == "exit0":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
for _ in ckpt.steps():
    ckpt.log(loss=step(pos))
