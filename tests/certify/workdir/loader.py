"""A plain PyTorch loop with the Checkpointer whose batches come from a shuffling DataLoader with no
generator of its own, its position (the batches taken) saved: the DataLoader draws its shuffle
seed from the global RNG when its iterator is made, which after a resume happens at another point
of that RNG than in the uninterrupted run, so the resumed run trains on other batches."""

import argparse
import time

import torch
from torch.utils.data import DataLoader

import tgnb.train

p = argparse.ArgumentParser()
p.add_argument("--max-steps", type=int, default=30)
p.add_argument("--step-s", type=float, default=0.05)  # a step's time, as a real one has
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(64, 4)
y = x.sum(dim=1, keepdim=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(range(64), batch_size=8, shuffle=True)


class Position:
    """The batches of `loader` taken so far; a resume skips them in the epoch."""

    def __init__(self) -> None:
        self.i = 0
        self.it = None

    def next(self) -> list[int]:
        if self.it is None or self.i % 64 == 0:  # a new epoch, or the first batch after a resume
            self.it = iter(loader)
            for _ in range((self.i % 64) // 8):
                next(self.it)
        self.i += 8
        return next(self.it).tolist()

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, d: dict) -> None:
        self.i = d["i"]


pos = Position()
ckpt = tgnb.train.Checkpointer(model, opt, max_steps=a.max_steps, dir="out")
ckpt.add_state("data", pos)
for _ in ckpt.steps():
    idx = pos.next()
    loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx] + 0.01 * torch.randn(8, 1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(a.step_s)
    ckpt.log(loss=loss.item())
