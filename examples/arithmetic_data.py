"""The data of the loop examples: tgnb's built-in arithmetic SFT set ("What is 2+1? Answer: 3"),
tokenized once, and a data order whose position is saved with the run (so a resumed run continues
with the batch it would have trained next). Replace it with your own data."""

from __future__ import annotations

import torch

from tgnb.tasks import data


def tokenized(tokenizer, rows: int = 2000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``labels`` (padding masked out) of `rows` examples."""
    texts = [r["prompt"] + r["completion"] for r in data.sft_rows(rows)]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    labels = enc.input_ids.masked_fill(enc.attention_mask == 0, -100)
    return enc.input_ids, enc.attention_mask, labels


class DataOrder:
    """A seeded permutation of the rows, walked batch by batch; ``state_dict()`` is its position."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        self.pos = 0

    def next_batch(self, size: int) -> torch.Tensor:
        idx = self.perm[(self.pos + torch.arange(size)) % len(self.perm)]
        self.pos += size
        return idx

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]
