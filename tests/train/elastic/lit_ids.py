"""A Lightning DDP script as Lightning's docs write it (``strategy="ddp"``,
``use_distributed_sampler=True``, its default) under ``tgnb.train.protect``, run by torchrun at any
world size: every rank prints the ids of the samples each batch trains (``ids E R i,j,...``).
``--sigterm-at K`` sends each rank SIGTERM at the end of step K, as a preemption would."""

import argparse
import os
import signal
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tgnb.train


class Numbered(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.x[i].sum(0, keepdim=True), i


class Lit(L.LightningModule):
    def __init__(self, sigterm_at: int) -> None:
        super().__init__()
        self.sigterm_at = sigterm_at
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y, ids = batch
        line = ",".join(str(int(i)) for i in ids)
        sys.stdout.write(
            f"ids {self.current_epoch} {self.global_rank} {line}\n"
        )  # one write: ranks share stdout
        sys.stdout.flush()
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sigterm-at", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    L.seed_everything(0)
    loader = DataLoader(Numbered(64), batch_size=4, shuffle=True)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        use_distributed_sampler=True,
        default_root_dir="out",
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    tgnb.train.protect(trainer)
    trainer.fit(Lit(args.sigterm_at), loader)


if __name__ == "__main__":
    main()
