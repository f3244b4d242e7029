"""A plain PyTorch loop through `tgnb.train.Checkpointer`, with the default checkpoint policy (no
interval given: ``checkpoint.auto``). ``--sleep`` seconds per step, ``--steps`` steps."""

from __future__ import annotations

import argparse
import time

import torch

import tgnb.train

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=100)
ap.add_argument("--sleep", type=float, default=0.05)
args = ap.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = tgnb.train.Checkpointer(model, opt, max_steps=args.steps, dir="out")
for _step in ckpt.steps():
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    ckpt.log(loss=loss.item())
    time.sleep(args.sleep)
print("loop: done", flush=True)
