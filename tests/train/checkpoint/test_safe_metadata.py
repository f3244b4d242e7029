"""DCP's ``.metadata`` is the one pickle tgnb reads from a checkpoint (`tgnb.train.dcpio.SafeReader`),
and a checkpoint on a shared volume must not be able to run code on load. Real DCP metadata (from
``dcp.save``) loads; hand-made pickles that reach a callable other than DCP's own metadata classes
are refused before it runs -- each would ``touch`` a file, and the file must not appear."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from tgnb.errors import CheckpointError
from tgnb.train.dcpio import SafeReader, split_state


def _call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle of ``module.name(arg)`` (STACK_GLOBAL, then REDUCE)."""

    def text(value: str) -> bytes:
        raw = value.encode()
        return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE

    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(arg) + b"\x85R."


def test_the_metadata_dcp_writes_loads(tmp_path: Path) -> None:
    state = {
        "model": {"w": torch.randn(4, 4), "b": torch.zeros(3, dtype=torch.bfloat16)},
        "optim": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 4)}},
    }  # tensors only, as tgnb writes (the rest goes to JSON)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DCP: "assuming ... a single process"
        dcp.save(state, storage_writer=FileSystemWriter(tmp_path))
    md = SafeReader(str(tmp_path)).read_metadata()
    assert set(md.state_dict_metadata) == {"model.w", "model.b", "optim.w.step", "optim.w.exp_avg"}
    assert md.state_dict_metadata["model.b"].properties.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "module,name",
    [
        ("posix", "system"),  # os.system by its own name
        ("torch.distributed.checkpoint.filesystem", "os.system"),  # dotted, through DCP's imports
        ("torch.distributed.checkpoint.metadata", "os.system"),
        ("builtins", "eval"),
        ("torch", "load"),  # torch's own names are admitted for dtypes only
    ],
)
def test_metadata_that_would_run_code_is_refused(tmp_path: Path, module: str, name: str) -> None:
    pwned = tmp_path / "pwned"
    arg = f"__import__('os').system('touch {pwned}')" if name == "eval" else f"touch {pwned}"
    (tmp_path / ".metadata").write_bytes(_call(module, name, arg))
    with pytest.raises(pickle.UnpicklingError, match="is not allowed in checkpoint metadata"):
        SafeReader(str(tmp_path)).read_metadata()
    assert not pwned.exists()


def test_metadata_that_is_not_dcp_metadata_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": {}}))
    with pytest.raises(pickle.UnpicklingError, match="holds no DCP metadata"):
        SafeReader(str(tmp_path)).read_metadata()


class _Payload:
    """Pickles as a call of ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, (self.command,)


def test_an_item_the_metadata_calls_pickled_is_never_unpickled(tmp_path: Path) -> None:
    """Valid metadata can still say an item is bytes, and DCP unpickles bytes items with
    ``torch.load(weights_only=False)``: a checkpoint whose ``w`` is such an item (here written by
    DCP itself) must be refused before anything is read, whatever the destination is."""
    pwned = tmp_path / "pwned"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": _Payload(f"touch {pwned}")}, storage_writer=FileSystemWriter(tmp_path / "c"))
        dest = {"w": torch.zeros(2)}
        # (DCP reports the error inside its CheckpointException, a BaseException)
        with pytest.raises(BaseException, match=r"lists pickled items \(w"):
            dcp.load(dest, storage_reader=SafeReader(str(tmp_path / "c")))
    assert not pwned.exists()


def test_a_model_whose_state_holds_a_non_tensor_is_refused_at_once() -> None:
    """A module's ``get_extra_state()`` may return any object, which DCP would pickle; a resume
    refuses pickles, so the save refuses it first (naming it) rather than write a checkpoint that
    can never be loaded."""

    class Odd(torch.nn.Linear):
        def get_extra_state(self) -> dict[str, str]:
            return {"note": "not a tensor"}

        def set_extra_state(self, state: object) -> None:
            pass

    model = Odd(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(CheckpointError, match="holds _extra_state, not a tensor"):
        split_state(model, opt, adapter_only=False)


@pytest.mark.parametrize("name", ["../secret.distcp", "/etc/hostname", ".metadata"])
def test_metadata_whose_files_lie_outside_the_checkpoint_is_refused(
    tmp_path: Path, name: str
) -> None:
    """DCP opens the file each item's metadata names: it must be a file of the checkpoint's own
    directory (a shard), not a path elsewhere or the metadata itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": torch.randn(3)}, storage_writer=FileSystemWriter(tmp_path))
    md = SafeReader(str(tmp_path)).read_metadata()
    for info in md.storage_data.values():
        info.relative_path = name
    md.storage_meta = None
    (tmp_path / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(pickle.UnpicklingError, match="points outside its directory"):
        SafeReader(str(tmp_path)).read_metadata()
