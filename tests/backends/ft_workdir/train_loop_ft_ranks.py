"""The program of `train_ft_ranks.py` (DDP inside a replica group of several ranks) written with
tgnb's Checkpointer instead of TorchFT's own API: ``Checkpointer(..., fault_tolerant=True)`` on
every rank sets up the Manager from torchrun's environment (rank 0 hosts the group's
ManagerServer), gates the optimizer's step on the quorum's commit and follows the Manager's step;
the quorum's first group writes the checkpoints (every rank of it its shards) and the metrics rows.
It prints the same lines as `train_ft_ranks.py` (``FT_STEPS``, ``FT_STEP_S``, ``FT_UNTIL``)."""

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn, optim
from torch.nn.parallel import DistributedDataParallel

import tgnb.train

STEPS = int(os.environ.get("FT_STEPS", "200"))
STEP_S = float(os.environ.get("FT_STEP_S", "0.05"))
GROUP = int(os.environ.get("REPLICA_GROUP_ID", "0"))
UNTIL = os.environ.get("FT_UNTIL", "")
RANK = int(os.environ["RANK"])


def last_step() -> int:
    try:
        with open(UNTIL, encoding="utf-8") as f:
            return min(STEPS, int(f.read()))
    except (OSError, ValueError):
        return STEPS


def say(**line: object) -> None:
    print(json.dumps({"group": GROUP, "rank": RANK, **line}), flush=True)


def main() -> None:
    dist.init_process_group("gloo")  # the group's own ranks, before the Checkpointer
    world = dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    model = DistributedDataParallel(net)
    opt = optim.SGD(model.parameters(), lr=0.01)
    ckpt = tgnb.train.Checkpointer(model, opt, max_steps=STEPS, fault_tolerant=True)
    assert ckpt.ft is not None
    gen = torch.Generator().manual_seed(GROUP * world + RANK)
    torchrun = {
        k.lower(): os.environ.get(k) for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT")
    }
    say(started=time.time(), pid=os.getpid(), inside="checkpointer",
        lighthouse=os.environ.get("TORCHFT_LIGHTHOUSE"),
        groups=os.environ.get("NUM_REPLICA_GROUPS"), **torchrun)  # fmt: skip
    for step in ckpt.steps():
        x = torch.randn(16, 32, generator=gen)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()  # DDP averages the gradients over the group's ranks
        time.sleep(STEP_S)
        opt.step()  # averaged across the groups, committed when the quorum agrees
        ckpt.log(loss=loss.item())
        if ckpt.ft.committed:
            say(step=step, participants=ckpt.ft.manager.num_participants(), t=time.time())
        ckpt.max_steps = last_step()  # the test's knob: the loop ends there, with its final save
    checksum = sum(float(p.detach().double().sum()) for p in net.parameters())
    say(done=ckpt.step, checksum=checksum, t=time.time())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
