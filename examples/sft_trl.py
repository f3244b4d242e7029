"""Supervised fine-tuning with TRL's ``SFTTrainer``, written as TRL's docs write it, plus one line:
``tgnb.train.protect(trainer)``. It runs offline on tgnb's built-in tiny model and arithmetic data;
pass ``--model`` a Hugging Face id and load your own dataset for real work.

    python examples/sft_trl.py                  # anywhere: checkpoints in out/; SIGTERM saves and
                                                # exits 75, running it again resumes
    %tg launch sft_trl.py --workdir examples -o run -- --max-steps 200    # on a cluster, preemptible

From Python: ``session.launch("sft_trl.py", workdir="examples", args=["--max-steps", "200"])``.
"""

import argparse

import torch
from trl import SFTConfig, SFTTrainer

import tgnb.train
from tgnb.tasks import assets, data

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="tiny", help="a Hugging Face id or path ('tiny': built in)")
parser.add_argument("--max-steps", type=int, default=60)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

# prompt/completion rows; with the Hub: load_dataset("trl-lib/Capybara", split="train")
dataset = data.load("arithmetic-sft")

training_args = SFTConfig(
    output_dir="out",
    max_steps=args.max_steps,
    learning_rate=args.lr,
    per_device_train_batch_size=8,
    logging_steps=1,
    max_length=32,
    report_to="none",
    bf16=torch.cuda.is_available(),  # float32 on a machine without a GPU
)
trainer = SFTTrainer(
    model=assets.resolve_model(args.model),
    args=training_args,
    train_dataset=dataset,
)
tgnb.train.protect(trainer)  # checkpoint on a preemption notice, resume by itself
trainer.train()
trainer.save_model("out/final")
print("sft example: done")
