"""A user's plain PyTorch training loop through `tgnb.train.Checkpointer`, as a user would write
it: one script for a laptop (``python loop_script.py --dir out``) and for torchrun (DDP on gloo;
FSDP2 with ``--fsdp``). ``--features`` widens the model (the disk-full test).

A small ``nn.Linear`` model, Adam, a StepLR schedule, a seeded data order with its own state (the
`Order` below, added with ``add_state``) and noise from the global torch RNG (so the RNG must be
restored too). Every rank draws the whole global batch of 8 and trains on its share: the run is
the same at any world size. When the loop finishes, rank 0 writes the final parameters to
``--out`` (safetensors)."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

import tgnb.train

GLOBAL_BATCH, SAMPLES = 8, 40


class Order:
    """A seeded shuffle of the data set, epoch after epoch; its position is its state."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0

    def take(self, k: int) -> torch.Tensor:
        out = []
        for _ in range(k):
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            out.append(int(torch.randperm(self.n, generator=g)[self.pos]))
            self.pos += 1
        return torch.tensor(out)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--out", default="")
    ap.add_argument("--features", type=int, default=8)
    ap.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    ap.add_argument("--default-backend", action="store_true", help="init_process_group()")
    ap.add_argument("--report-to", default="", help="wandb,mlflow: the Checkpointer's report_to")
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group() if args.default_backend else dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(SAMPLES, args.features, generator=g)
    ys = torch.randn(SAMPLES, 2, generator=g)
    net = model = torch.nn.Linear(args.features, 2)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        if world == 1:
            dist.init_process_group() if args.default_backend else dist.init_process_group("gloo")
        model = fully_shard(net)
    elif world > 1:
        model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.8)
    order = Order(SAMPLES, seed=7)
    ckpt = tgnb.train.Checkpointer(
        model,
        opt,
        sched,
        max_steps=args.steps,
        dir=args.dir,
        checkpoint={"every_steps": args.every},
        global_batch=GLOBAL_BATCH,
        report_to=args.report_to.split(",") if args.report_to else None,
    )
    ckpt.add_state("data", order)
    share = GLOBAL_BATCH // world
    mine = slice(rank * share, (rank + 1) * share)
    for _step in ckpt.steps():
        idx = order.take(GLOBAL_BATCH)
        x = xs[idx] + 0.1 * torch.randn(GLOBAL_BATCH, args.features)  # the same on every rank
        loss = ((model(x[mine]) - ys[idx][mine]) ** 2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        ckpt.log(loss=loss.item())
        time.sleep(args.sleep)
    if args.fsdp:  # every rank takes part in gathering the shards
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        final = get_model_state_dict(model, options=full)
    else:
        final = net.state_dict()
    if args.out and rank == 0:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in final.items()}, args.out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
