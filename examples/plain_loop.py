"""A plain PyTorch training loop (no Trainer) made preemption-safe with ``tgnb.train.Checkpointer``:
the built-in tiny causal LM learns the built-in arithmetic set. One process, or several under
torchrun (DDP; each rank trains on its share of the global batch).

    python examples/plain_loop.py               # anywhere: checkpoints in out/; SIGTERM saves and
                                                # exits 75, running it again resumes
    torchrun --nproc_per_node 2 examples/plain_loop.py
    %tg launch plain_loop.py --workdir examples -o run -- --max-steps 200

From Python: ``session.launch("plain_loop.py", workdir="examples", args=["--max-steps", "200"])``.
"""

import argparse
import os

import torch
import torch.distributed as dist
from arithmetic_data import DataOrder, tokenized
from transformers import AutoModelForCausalLM, AutoTokenizer

import tgnb.train
from tgnb.tasks import assets


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", help="a Hugging Face id or path")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=8, help="the global batch")
    args = parser.parse_args()

    path = assets.resolve_model(args.model)  # the tiny model is written before the group starts
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group()
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    input_ids, attention_mask, labels = tokenized(tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.max_steps)
    order = DataOrder(len(input_ids))

    ckpt = tgnb.train.Checkpointer(
        model, opt, sched, max_steps=args.max_steps, dir="out", global_batch=args.batch
    )
    ckpt.add_state("data", order)  # the data position is saved and restored with the run
    share = args.batch // world
    for _step in ckpt.steps():  # from the saved step + 1; stops (exit 75) on a preemption
        idx = order.next_batch(args.batch)[rank * share : (rank + 1) * share]
        out = model(
            input_ids=input_ids[idx], attention_mask=attention_mask[idx], labels=labels[idx]
        )
        out.loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        ckpt.log(loss=out.loss)
    if rank == 0:
        print("plain loop: done", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
