"""A Lightning script as Lightning's own docs write it (LightningModule + Trainer.fit), plus
``tgnb.train.protect(trainer)``: a tiny regression model on data made here. ``--sigterm-at K``
sends the process SIGTERM at the end of step K (as a preemption would); ``--params FILE`` saves the
trained parameters."""

import argparse
import os
import signal

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tgnb.train


class LitRegressor(L.LightningModule):
    def __init__(self, lr: float, sigterm_at: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step == self.hparams.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        return [optimizer], [scheduler]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="out")
    parser.add_argument("--devices", type=int, default=1)  # under torchrun: its processes
    parser.add_argument("--sigterm-at", type=int, default=0)
    parser.add_argument("--params", default="")
    parser.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    L.seed_everything(0)
    x = torch.randn(256, 8)
    y = x.sum(dim=1, keepdim=True)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=args.shuffle)

    model = LitRegressor(lr=args.lr, sigterm_at=args.sigterm_at)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        default_root_dir=args.out,
        enable_progress_bar=False,
        logger=False,
    )
    tgnb.train.protect(trainer)
    trainer.fit(model, train_loader)
    if args.params:
        torch.save(model.state_dict(), args.params)
    print("lightning script: done", flush=True)


if __name__ == "__main__":
    main()
