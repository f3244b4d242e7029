"""A Hugging Face Accelerate training loop made preemption-safe with ``tgnb.train.Checkpointer``
(the objects ``Accelerator.prepare`` returns checkpoint and resume like plain ones): the built-in
tiny causal LM learns the built-in arithmetic set.

    python examples/accelerate_loop.py          # anywhere: checkpoints in out/; SIGTERM saves and
                                                # exits 75, running it again resumes
    accelerate launch examples/accelerate_loop.py
    %tg launch accelerate_loop.py --workdir examples -o run -- --max-steps 200

From Python: ``session.launch("accelerate_loop.py", workdir="examples", args=[...])`` (torchrun
starts one process per GPU and Accelerate reads its environment), or
``session.launch(command=["accelerate", "launch", "accelerate_loop.py"], workdir="examples")``.
"""

import argparse

import torch
from accelerate import Accelerator
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
    accelerator = Accelerator()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.max_steps)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    input_ids, attention_mask, labels = tokenized(tokenizer)
    order = DataOrder(len(input_ids))

    ckpt = tgnb.train.Checkpointer(
        model, opt, sched, max_steps=args.max_steps, dir="out", global_batch=args.batch
    )
    ckpt.add_state("data", order)
    share = args.batch // accelerator.num_processes
    mine = slice(accelerator.process_index * share, (accelerator.process_index + 1) * share)
    for _step in ckpt.steps():  # from the saved step + 1; stops (exit 75) on a preemption
        idx = order.next_batch(args.batch)[mine]
        ids, mask, lab = (
            t[idx].to(accelerator.device) for t in (input_ids, attention_mask, labels)
        )
        loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        ckpt.log(loss=loss)
    if accelerator.is_main_process:
        print("accelerate loop: done", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
