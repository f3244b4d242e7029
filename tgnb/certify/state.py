"""The final state of a run, compared with another's: the parameters of each run's newest sealed
checkpoint, read back with `torch.distributed.checkpoint` (no model needed: the tensors are made
from the checkpoint's own metadata and loaded through `tgnb.train.dcpio.SafeReader`).

Equal bit for bit is what a deterministic CPU run resumed correctly gives; within `RTOL`/`ATOL` is
what a run gives whose kernels are not deterministic (threads, GPUs); anything else is a resume that
restored less than the run had.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgnb.runs.node import CHECKPOINTS
from tgnb.train import checkpoint as ck

#: The tolerance of "equal" for parameters that are not equal bit for bit.
RTOL = 1e-4
ATOL = 1e-6
#: The model's entries in a checkpoint's DCP state (`tgnb.train.dcpio.split_state`).
MODEL_PREFIX = "model."


@dataclass(frozen=True)
class StateMatch:
    """How the chaos run's final parameters compare with the uninterrupted run's."""

    verdict: str  # "bitwise", "within tolerance", "differs", "missing"
    detail: str
    step: int | None = None  # the step of the checkpoints compared

    @property
    def ok(self) -> bool:
        return self.verdict in ("bitwise", "within tolerance")


def newest(run_dir: Path | None) -> ck.Checkpoint | None:
    """The newest sealed checkpoint of the run directory `run_dir` (None: there is none)."""
    if run_dir is None or not (run_dir / CHECKPOINTS).is_dir():
        return None
    return ck.latest_complete(run_dir / CHECKPOINTS)


def parameters(path: Path) -> dict[str, Any]:
    """The model tensors of the sealed checkpoint `path`, by name (``model.`` dropped)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from tgnb.train.dcpio import STATE_DIR, SafeReader

    reader = SafeReader(path / STATE_DIR)
    metadata = reader.read_metadata()
    state = {
        fqn: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
        for fqn, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata) and fqn.startswith(MODEL_PREFIX)
    }
    with warnings.catch_warnings():  # DCP says it assumes one process: that is meant here
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, storage_reader=SafeReader(path / STATE_DIR), no_dist=True)
    return {fqn[len(MODEL_PREFIX) :]: t for fqn, t in state.items()}


def compare(reference: Path | None, chaos: Path | None) -> StateMatch:
    """The newest sealed checkpoints of two run directories, parameter by parameter."""
    ref, got = newest(reference), newest(chaos)
    if ref is None:
        return StateMatch("missing", "the uninterrupted run left no sealed checkpoint")
    if got is None:
        return StateMatch("missing", "the interrupted run left no sealed checkpoint")
    if ref.step != got.step:
        return StateMatch(
            "differs",
            f"the interrupted run ended at step {got.step}, the uninterrupted one at {ref.step}",
            got.step,
        )
    import torch

    a, b = parameters(ref.path), parameters(got.path)
    if sorted(a) != sorted(b):
        return StateMatch("differs", "the two checkpoints hold different parameters", got.step)
    worst, where = 0.0, ""
    close = True
    for name, ta in a.items():
        tb = b[name]
        if torch.equal(ta, tb):
            continue
        diff = float((ta.double() - tb.double()).abs().max())
        if diff > worst:
            worst, where = diff, name
        close = close and torch.allclose(ta.double(), tb.double(), rtol=RTOL, atol=ATOL)
    n = len(a)
    if not where:
        return StateMatch("bitwise", f"{n} parameter tensors equal bit for bit", got.step)
    detail = f"max |diff| {worst:.3g} in {where} ({n} tensors; rtol {RTOL:g}, atol {ATOL:g})"
    return StateMatch("within tolerance" if close else "differs", detail, got.step)


def saved_data_position(path: Path) -> bool:
    """Whether the sealed checkpoint `path` says where in its data the run was: a Trainer's or a
    protected Lightning fit loop's own state, or a `Checkpointer` loop with a state added
    (`Checkpointer.add_state`: a sampler, a data position)."""
    loop = path / "loop.json"
    if not loop.exists():
        return True  # a Trainer or Lightning: tgnb saves the data position itself
    states = json.loads(loop.read_text(encoding="utf-8")).get("states") or {}
    return bool(states)
