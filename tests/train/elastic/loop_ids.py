"""A plain DDP loop under `tgnb.train.Checkpointer` with `tgnb.train.ElasticSampler` saved by
``add_state``, run by torchrun at any world size: every rank prints the ids of the samples each
step trains (``ids E R i,j,...``). ``--sigterm-at K`` asks for the stop at step K."""

import argparse
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

import tgnb.train


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sigterm-at", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=40)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    ids = list(range(64))
    sampler = tgnb.train.ElasticSampler(ids, shuffle=True, seed=0)
    loader = DataLoader(ids, batch_size=4, sampler=sampler)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = tgnb.train.Checkpointer(
        model, opt, max_steps=args.max_steps, dir="out", global_batch=4 * dist.get_world_size()
    )
    ckpt.add_state("data", sampler)
    batches = None
    for step in ckpt.steps():
        batch = None
        while batch is None:
            if batches is not None and (batch := next(batches, None)) is not None:
                break
            if batches is not None:  # the epoch ended: the next one
                sampler.set_epoch(sampler.epoch + 1)
            batches = iter(loader)
        line = ",".join(str(int(i)) for i in batch)
        sys.stdout.write(
            f"ids {sampler.epoch} {dist.get_rank()} {line}\n"
        )  # one write: ranks share stdout
        sys.stdout.flush()
        loss = model(batch.float().unsqueeze(1).repeat(1, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == args.sigterm_at:
            ckpt.request_stop()


if __name__ == "__main__":
    main()
