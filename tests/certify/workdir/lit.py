"""A Lightning script as Lightning's own docs write it (LightningModule + Trainer.fit), plus
``tgnb.train.protect(trainer)`` (left out with ``--no-protect``): a tiny regression model. Its data
is not shuffled unless ``--shuffle`` (a shuffled epoch resumed in its middle replays its order:
`tgnb.train.lightning` keeps the RNG state the epoch's order was drawn from)."""

import argparse

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tgnb.train


class LitRegressor(L.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        return [optimizer], [scheduler]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--out", default="out")
    parser.add_argument("--no-protect", action="store_true")
    parser.add_argument("--shuffle", action="store_true")
    args = parser.parse_args()

    L.seed_everything(0)
    torch.set_num_threads(1)
    x = torch.randn(256, 8)
    y = x.sum(dim=1, keepdim=True)
    train_loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=args.shuffle)

    model = LitRegressor(lr=args.lr)
    trainer = L.Trainer(
        max_steps=args.max_steps,
        accelerator="cpu",
        devices=1,
        default_root_dir=args.out,
        enable_progress_bar=False,
        logger=False,
    )
    if not args.no_protect:
        tgnb.train.protect(trainer)
    trainer.fit(model, train_loader)
    print("lightning script: done", flush=True)


if __name__ == "__main__":
    main()
