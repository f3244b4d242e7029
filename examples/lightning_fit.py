"""A PyTorch Lightning script as Lightning's docs write it (a ``LightningModule`` and
``Trainer.fit``), plus one line: ``tgnb.train.protect(trainer)``. The built-in tiny causal LM learns
the built-in arithmetic set.

    python examples/lightning_fit.py            # anywhere: checkpoints in out/checkpoints; SIGTERM
                                                # saves and exits 75, running it again resumes
    %tg launch lightning_fit.py --workdir examples -o run -- --max-steps 200

From Python: ``session.launch("lightning_fit.py", workdir="examples", args=["--max-steps", "200"])``.
"""

import argparse

import lightning as L
import torch
from arithmetic_data import tokenized
from torch.utils.data import DataLoader, TensorDataset
from transformers import AutoModelForCausalLM, AutoTokenizer

import tgnb.train
from tgnb.tasks import assets


class LitCausalLM(L.LightningModule):
    def __init__(self, path: str, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = AutoModelForCausalLM.from_pretrained(path)

    def training_step(self, batch, batch_idx):
        input_ids, attention_mask, labels = batch
        loss = self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
        return [optimizer], [scheduler]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", help="a Hugging Face id or path")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    L.seed_everything(0)
    path = assets.resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    train_loader = DataLoader(TensorDataset(*tokenized(tokenizer)), batch_size=8, shuffle=True)

    model = LitCausalLM(path, lr=args.lr)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        default_root_dir="out",
        enable_progress_bar=False,
        logger=False,
    )
    tgnb.train.protect(trainer)  # checkpoint on a preemption notice, resume by itself
    trainer.fit(model, train_loader)
    print("lightning example: done", flush=True)


if __name__ == "__main__":
    main()
