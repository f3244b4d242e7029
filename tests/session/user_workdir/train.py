"""A user's SFT script, as TRL's quickstart writes it, plus tgnb.train.protect."""

import argparse

from datasets import load_dataset
from prompts import to_example
from trl import SFTConfig, SFTTrainer

import tgnb.train

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--max-steps", type=int, default=30)
parser.add_argument("--report-to", default="none")
args = parser.parse_args()

dataset = load_dataset("json", data_files="data.jsonl", split="train").map(to_example)
training_args = SFTConfig(
    output_dir="out",
    max_steps=args.max_steps,
    learning_rate=args.lr,
    per_device_train_batch_size=8,
    logging_steps=1,
    max_length=32,
    report_to=args.report_to.split(","),
    use_cpu=True,
)
trainer = SFTTrainer(model=args.model, args=training_args, train_dataset=dataset)
tgnb.train.protect(trainer)
trainer.train()
trainer.save_model("out/final")
print("user script: done")
