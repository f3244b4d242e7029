"""The loop of `train_ft.py` without TorchFT, for checkpoint-restart: plain DDP over gloo across the
run's nodes (torchrun), checkpointed by `tgnb.train.Checkpointer` (on a notice, and every
``checkpoint.every_steps``), resumed from its last checkpoint after a restart. The same model,
data and step time; the same JSON line per step (``group`` is the node's rank, ``participants``
the world size), for `bench/fault_tolerance.py`."""

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn, optim

import tgnb.train

STEPS = int(os.environ.get("FT_STEPS", "200"))
STEP_S = float(os.environ.get("FT_STEP_S", "0.05"))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = optim.SGD(ddp.parameters(), lr=0.01)
    ckpt = tgnb.train.Checkpointer(ddp, opt, max_steps=STEPS)
    gen = torch.Generator().manual_seed(rank)
    print(json.dumps({"group": rank, "started": time.time()}), flush=True)
    for step in ckpt.steps():
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        loss = ddp(x).pow(2).mean()
        time.sleep(STEP_S)  # the rest of a step's compute
        loss.backward()
        opt.step()
        ckpt.log(loss=loss.item())
        line = {
            "group": rank,
            "step": step,
            "participants": dist.get_world_size(),
            "t": time.time(),
        }
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
