"""PyTorch's DDP example for torchrun, made small (gloo on the CPU): ``init_process_group("gloo")``
reads RANK, WORLD_SIZE and the rendezvous from the environment torchrun sets, with no fallback for
a run without it. Each rank appends what it was given to ``ranks.jsonl`` in the run directory
(``{"phase", "rank", "world", "local_rank", "local_world", "node", "restart", "pid"}``): ``started`` once
every rank joined, ``done`` after the last step.

``--hold``: the first start (restart count 0) trains until it is stopped (a test preempts it);
a restart trains ``--steps`` steps and ends."""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def note(phase: str) -> None:
    row = {
        "phase": phase,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
        "node": os.environ.get("TGNB_NODE") or os.environ.get("SLURMD_NODENAME", ""),
        "restart": int(os.environ.get("TGNB_RESTART_COUNT") or 0),
        "pid": os.getpid(),
    }
    with open(os.path.join(os.environ["TGNB_RUN_DIR"], "ranks.jsonl"), "a") as fh:
        fh.write(json.dumps(row) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--hold", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    note("started")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hold = args.hold and int(os.environ.get("TGNB_RESTART_COUNT") or 0) == 0
    step = 0
    while hold or step < args.steps:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if hold:
            time.sleep(0.05)
    note("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
