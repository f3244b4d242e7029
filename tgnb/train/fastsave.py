"""Write a single-process Trainer checkpoint straight from memory, hashing every file as it goes.

`write_checkpoint` writes what ``Trainer._save_checkpoint`` writes for one process when it resumes --
``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth`` and
``trainer_state.json`` -- so the Trainer's own ``train(resume_from_checkpoint=...)`` reads it
unchanged. What it does differently, and why it is about as fast as writing the same bytes:

- the weights go from the tensors' memory to the file in the safetensors format with no
  intermediate object (``safetensors.torch.save_file`` first turns every tensor into ``bytes``);
- ``torch.save`` writes into a file object that hashes what passes through it (torch hands it
  memoryviews of the tensors, CRC32 off), so no file is read back to be checksummed;
- the two large files bypass the page cache (``O_DIRECT``, see `tgnb.train.hashedio`), are written
  at the same time and fsynced in parallel (xxhash, writes and fsyncs release the GIL).

It returns the manifest entries (`tgnb.train.checkpoint.FileEntry`) that
`tgnb.train.checkpoint.write_marker` then seals without re-reading. The config, tokenizer and
training arguments are not written: the Trainer's resume does not read them (the final checkpoint
is the Trainer's own, complete one). Whatever this cannot write raises `Unsupported` before it
writes anything, and the caller falls back to the Trainer's save.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import json
import os
import random
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tgnb.train import checkpoint as ck
from tgnb.train.hashedio import HashingFile

__all__ = [
    "Unsupported",
    "bytes_view",
    "capture_rng",
    "dtype_code",
    "model_tensors",
    "write_checkpoint",
    "write_safetensors",
]

_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


#: `dtype_code` answers, by torch dtype (it runs for every tensor of a snapshot).
_BY_DTYPE: dict[Any, str | None] = {}
#: Whether CUDA is available (asked once: `capture_rng` runs at every step boundary).
_CUDA: bool | None = None


class Unsupported(Exception):
    """This trainer's state cannot be written here; use the Trainer's own save."""


def dtype_code(t: Any) -> str | None:
    """The safetensors name of `t`'s dtype, or None when safetensors cannot hold it."""
    try:
        return _BY_DTYPE[t.dtype]
    except KeyError:
        code = _BY_DTYPE[t.dtype] = _DTYPES.get(str(t.dtype).removeprefix("torch."))
        return code


def bytes_view(t: Any) -> Any:
    """`t`'s bytes as a buffer (``len`` is its size in bytes): its own memory when it is a
    contiguous CPU tensor (then the buffer borrows that memory: keep `t` alive while it is
    used), else a contiguous CPU copy's."""
    if t.is_cpu and t.is_contiguous():
        return (ctypes.c_char * t.nbytes).from_address(t.data_ptr())
    import torch

    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.to("cpu")
    flat = flat.contiguous()
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def model_tensors(model: Any) -> dict[str, Any]:
    """The model's state dict without aliases (tied weights are written once, under the first
    name, as ``save_pretrained`` does; the Trainer's resume loads with strict=False)."""
    seen: set[tuple[Any, ...]] = set()
    out = {}
    for name, t in model.state_dict().items():
        if t.is_meta:
            raise Unsupported(f"{name} is on the meta device")
        if dtype_code(t) is None:
            raise Unsupported(f"{name} has dtype {t.dtype}, which safetensors cannot hold")
        key = (t.device, t.data_ptr(), t.dtype, t.shape, t.stride())
        if key in seen:
            continue
        seen.add(key)
        out[name] = t
    return out


def write_safetensors(
    path: Path,
    tensors: dict[str, Any],
    algorithm: str,
    direct: bool = False,
) -> HashingFile:
    """Write `tensors` to `path` in the safetensors format from their own memory (not fsynced)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": dtype_code(t),
            "shape": list(t.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    out = HashingFile(path, algorithm, direct=direct)
    try:
        out.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors.values():
            if t.numel():
                out.write(bytes_view(t))
        out.finish()
    except BaseException:
        out.close()
        raise
    return out


def capture_rng() -> dict[str, Any]:
    """The RNG states ``Trainer._save_rng_state`` saves for one process (python, numpy, cpu,
    cuda), taken now."""
    import numpy as np
    import torch

    global _CUDA
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if _CUDA is None:
        _CUDA = bool(torch.cuda.is_available())
    if _CUDA:
        states["cuda"] = torch.cuda.random.get_rng_state()
    return states


def check_supported(trainer: Any, optimizer: bool = True) -> None:
    """Raise `Unsupported` unless this trainer's checkpoint is the single-process kind written
    here: no DeepSpeed, FSDP, PEFT adapter, gradient scaler, several processes, or device other
    than the CPU and CUDA; and (with `optimizer`) an optimizer and scheduler exist."""
    from transformers.utils import is_torch_xla_available

    args = trainer.args
    if int(args.world_size) > 1:
        raise Unsupported("several processes")
    if getattr(trainer, "is_deepspeed_enabled", False) or getattr(
        trainer, "is_fsdp_enabled", False
    ):
        raise Unsupported("DeepSpeed or FSDP")
    if hasattr(trainer.model, "peft_config"):
        raise Unsupported("a PEFT adapter (the Trainer saves only the adapter)")
    if getattr(trainer, "use_adaptive_entropy", False):
        raise Unsupported("GRPO's adaptive entropy (it saves its own state too)")
    if getattr(trainer.accelerator, "scaler", None) is not None:
        raise Unsupported("a gradient scaler")
    if is_torch_xla_available() or args.device.type not in ("cpu", "cuda"):
        raise Unsupported(f"device {args.device}")
    if optimizer and (trainer.optimizer is None or trainer.lr_scheduler is None):
        raise Unsupported("no optimizer yet")


def trainer_state(trainer: Any) -> Any:
    """A copy of `trainer`'s ``TrainerState`` with the stateful callbacks' states in it, as
    ``Trainer._save_checkpoint`` saves it (shallow: the log history is shared)."""
    import copy

    from transformers.trainer_callback import ExportableState

    state = copy.copy(trainer.state)
    callbacks = dict(state.stateful_callbacks or {})
    for cb in [*trainer.callback_handler.callbacks, trainer.control]:
        if isinstance(cb, ExportableState):
            name = cb.__class__.__name__
            if isinstance(callbacks.get(name), list):
                callbacks[name] = [*callbacks[name], cb.state()]
            else:
                callbacks[name] = cb.state()
    state.stateful_callbacks = callbacks
    return state


def trainer_state_json(trainer: Any) -> str:
    """``trainer_state.json`` as ``Trainer._save_checkpoint`` writes it, without changing the
    trainer's state."""
    return json.dumps(dataclasses.asdict(trainer_state(trainer)), indent=2, sort_keys=True) + "\n"


def _torch_save(obj: Any, path: Path, algorithm: str, direct: bool = False) -> HashingFile:
    import torch

    out = HashingFile(path, algorithm, direct=direct)
    try:
        torch.save(obj, out)  # type: ignore[arg-type]  # a write-only binary file
        out.finish()
    except BaseException:
        out.close()
        raise
    return out


#: Files at least this big bypass the page cache (`tgnb.train.hashedio`); smaller ones are
#: faster through it (one fsync instead of a synchronous device write and an fsync).
DIRECT_MIN_BYTES = 16 << 20


def _large(tensors: Any) -> bool:
    return sum(t.numel() * t.element_size() for t in tensors) >= DIRECT_MIN_BYTES


def _state_tensors(osd: dict[str, Any]) -> list[Any]:
    import torch

    return [v for s in osd["state"].values() for v in s.values() if isinstance(v, torch.Tensor)]


def _close_all(files: list[HashingFile]) -> None:
    for f in files:
        f.close()


def _small(data: bytes, path: Path, algorithm: str) -> HashingFile:
    out = HashingFile(path, algorithm)
    try:
        out.write(data)
    except BaseException:
        out.close()
        raise
    return out


@contextlib.contextmanager
def _no_crc32() -> Iterator[None]:
    """``torch.save`` without the CRC32 of every record (it costs as much as the write; the
    manifest's checksums cover the same bytes and ``torch.load`` does not check the CRCs)."""
    import torch.serialization as ts

    if not hasattr(ts, "set_crc32_options"):
        yield
        return
    before = ts.get_crc32_options()
    ts.set_crc32_options(False)
    try:
        yield
    finally:
        ts.set_crc32_options(before)


def write_checkpoint(
    trainer: Any, path: str | os.PathLike[str], rng: dict[str, Any], algorithm: str | None = None
) -> list[ck.FileEntry]:
    """Write `trainer`'s checkpoint into the new directory `path`, every file fsynced.

    `rng` is the RNG states of the step boundary the checkpoint is of (`capture_rng` there). The
    model, optimizer and scheduler are read as they are now: the caller makes sure the trainer is
    not changing them meanwhile. Returns the manifest entries of the files written.
    """
    import torch

    check_supported(trainer)
    algo = algorithm or ck.default_algorithm()
    root = Path(path)
    tensors = model_tensors(trainer.model)
    root.mkdir(parents=True, exist_ok=False)
    files: list[HashingFile] = []
    with contextlib.ExitStack() as stack:
        stack.callback(_close_all, files)
        stack.enter_context(_no_crc32())
        state = trainer_state_json(trainer).encode()
        buf = io.BytesIO()
        torch.save(trainer.lr_scheduler.state_dict(), buf)
        scheduler = buf.getvalue()
        buf = io.BytesIO()
        torch.save(rng, buf)
        files.append(_small(buf.getvalue(), root / "rng_state.pth", algo))
        files.append(_small(scheduler, root / "scheduler.pt", algo))
        files.append(_small(state, root / "trainer_state.json", algo))
        with ThreadPoolExecutor(max_workers=2) as pool:
            weights = pool.submit(
                write_safetensors,
                root / "model.safetensors",
                tensors,
                algo,
                _large(tensors.values()),
            )
            syncing = [pool.submit(os.fsync, f.fileno()) for f in files]
            osd = trainer.optimizer.state_dict()
            try:
                files.append(
                    _torch_save(osd, root / "optimizer.pt", algo, _large(_state_tensors(osd)))
                )
            finally:
                files.append(weights.result())
            big = [pool.submit(os.fsync, f.fileno()) for f in files[-2:]]
            for done in (*syncing, *big):
                done.result()
    return [f.entry(root) for f in files]
