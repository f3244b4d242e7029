"""The state of a training run on disk, through `torch.distributed.checkpoint` (DCP).

One layout for every case (one process, DDP, FSDP, a PEFT adapter; a Trainer or a plain loop)::

    checkpoint-<step>/
      dcp/                   DCP shards, every rank writing its own in parallel (+ .metadata)
      optimizer.json         the optimizer's param groups (lr, betas, ...), from rank 0
      scheduler.json         the learning-rate scheduler's state, from rank 0
      trainer_state.json     the Trainer's own JSON state (step, log history), from rank 0
      loop.json              a `tgnb.train.Checkpointer` loop's step and added states, from rank 0
      rng-<rank>.safetensors each rank's RNG states (torch, CUDA, numpy as tensors; Python's in the
                             safetensors metadata as JSON)
      tgnb-complete.json     the marker, rank 0, last (tgnb.train.checkpoint)

Model and optimizer tensors come from ``torch.distributed.checkpoint.state_dict.get_state_dict`` (a
PEFT model: the trainable adapter only, ``ignore_frozen_params``), so DCP reshards them on load when
the world size changed. Nothing is unpickled from a checkpoint except DCP's ``.metadata``, which is
read by `SafeReader` with an unpickler that admits only DCP's own metadata classes: a checkpoint on a
shared volume cannot run code on load. The shards are written by `tgnb.train.dcpwriter`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import random
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from tgnb.errors import CheckpointError
from tgnb.train import checkpoint as ck
from tgnb.train import record

STATE_DIR = "dcp"
_METADATA = "torch.distributed.checkpoint.metadata"
#: What DCP's ``.metadata`` pickle may name, exactly (a dotted name, which pickle resolves attribute
#: by attribute, is refused: through a module's imports it could reach ``os.system``).
_ALLOWED = {
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(
        (_METADATA, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    ),
}
_DTYPES = {str(t).split(".")[-1] for t in vars(torch).values() if isinstance(t, torch.dtype)}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in checkpoint metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader, its ``.metadata`` unpickled with an allow-list (no code can run), that
    asks the kernel to read ahead what this rank will load."""

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Before the reads: ``posix_fadvise(WILLNEED)`` on the byte ranges of this rank's plan, so
        the kernel streams them in the background while DCP reads item by item in plan order (not
        file order); a cold resume then reads at the disk's pace. Only this rank's ranges: a
        sharded (FSDP) state is not read whole by every node."""
        if hasattr(os, "posix_fadvise"):
            spans: dict[str, list[tuple[int, int]]] = {}
            for item in plan.items:
                info = self.storage_data[item.storage_index]
                spans.setdefault(info.relative_path, []).append((info.offset, info.length))
            for rel, ranges in spans.items():
                fd = os.open(Path(self.path) / rel, os.O_RDONLY)
                try:
                    for offset, length in sorted(ranges):
                        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
                finally:
                    os.close(fd)
        return super().prepare_local_plan(plan)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / ".metadata"
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} holds no DCP metadata")
        # DCP unpickles an item its metadata calls bytes with torch.load(weights_only=False): tgnb
        # writes tensors only (the rest goes to JSON), so such an item is refused before any read
        items = metadata.state_dict_metadata.items()
        pickled = [k for k, m in items if not isinstance(m, TensorStorageMetadata)]
        if pickled:
            raise pickle.UnpicklingError(
                f"{path} lists pickled items ({pickled[0]}...): not loaded"
            )
        names = {info.relative_path for info in (metadata.storage_data or {}).values()}
        if outside := [n for n in names if Path(n).name != n or n.startswith(".")]:
            raise pickle.UnpicklingError(f"{path} points outside its directory ({outside[0]})")
        meta = metadata.storage_meta or StorageMeta()
        meta.load_id = self.load_id
        metadata.storage_meta = meta
        return metadata


def dist_up() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return int(dist.get_rank()) if dist_up() else record.rank()


def world() -> int:
    return int(dist.get_world_size()) if dist_up() else 1


def flags_device() -> Any:
    """Where the stop flags' collective runs: the CPU with one process, or when the process group
    takes CPU tensors (gloo, a ``"cpu:gloo,cuda:nccl"`` pair, or the default backend of
    ``init_process_group()`` on a machine without a GPU); else this rank's GPU (NCCL)."""
    if not dist_up():
        return "cpu"
    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or not torch.cuda.is_available():
        return "cpu"
    return torch.device("cuda", torch.cuda.current_device())


def any_rank(flags: list[int], group: Any = None, device: Any = "cpu") -> list[int]:
    """Each flag's maximum over the ranks of `group` (one collective; the flags as they are in
    one process): what every rank then decides alike."""
    if not dist_up():
        return flags
    t = torch.tensor(flags, dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [int(x) for x in t.tolist()]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """DCP warns that it assumes one process when torch.distributed is not started: that is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _options(adapter_only: bool) -> StateDictOptions:
    # an adapter's checkpoint holds the trainable parameters only: the frozen base is not loaded
    return StateDictOptions(ignore_frozen_params=adapter_only, strict=not adapter_only)


def split_state(model: Any, optimizer: Any, adapter_only: bool) -> tuple[dict[str, Any], dict]:
    """``({"model": tensors, "optim": tensors}, plain)``: what DCP writes (the model's tensors and
    the optimizer's per-parameter tensors, by parameter name), and what goes to JSON (the param
    groups, and any per-parameter value that is not a tensor)."""
    msd, osd = get_state_dict(model, optimizer, options=_options(adapter_only))
    if adapter_only:  # a frozen weight tied to another (lm_head) is listed too: leave it out
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        msd = {k: v for k, v in msd.items() if k in trainable}
    odd = [k for k, v in msd.items() if not isinstance(v, torch.Tensor)]
    if odd:  # a module's get_extra_state(): DCP would pickle it, and a resume refuses pickles
        raise CheckpointError(f"the model's state holds {odd[0]}, not a tensor: not checkpointed")
    tensors: dict[str, dict[str, Any]] = {}
    other: dict[str, dict[str, Any]] = {}
    state: dict[str, Any] = osd["state"]  # type: ignore[assignment]
    for fqn, entry in state.items():
        tensors[fqn] = {k: v for k, v in entry.items() if isinstance(v, torch.Tensor)}
        other[fqn] = {k: v for k, v in entry.items() if not isinstance(v, torch.Tensor)}
    plain = {"param_groups": osd["param_groups"], "state": other}
    return {"model": msd, "optim": tensors}, plain


def own_share(state: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What this rank writes of `state` (from `split_state`): every sharded (``DTensor``) entry, and
    its share of the replicated ones (plain tensors: under DDP every rank holds them all), shared
    out by size, largest first, the same way on every rank. DCP would de-duplicate them as well,
    but only after an asynchronous save has staged them: this way each rank copies 1/world of them
    to CPU memory, not all of them. On load every rank reads every entry, wherever it was written."""
    if not dist_up():
        return state
    from torch.distributed.tensor import DTensor

    leaves: list[tuple[int, tuple[str, str, str]]] = []
    for top, entries in state.items():
        for key, value in entries.items():
            for sub, t in value.items() if isinstance(value, dict) else [("", value)]:
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                    leaves.append((t.numel() * t.element_size(), (top, key, sub)))
    load = [0] * world()
    owner: dict[tuple[str, str, str], int] = {}
    for size, path in sorted(leaves, key=lambda x: (-x[0], x[1])):
        owner[path] = load.index(min(load))
        load[owner[path]] += size
    me = rank()
    out: dict[str, dict[str, Any]] = {}
    for top, entries in state.items():
        out[top] = {}
        for key, value in entries.items():
            if not isinstance(value, dict):
                if owner.get((top, key, ""), me) == me:
                    out[top][key] = value
            elif part := {s: t for s, t in value.items() if owner.get((top, key, s), me) == me}:
                out[top][key] = part
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value


def write_json(path: Path, data: Any) -> None:
    """`data` as JSON (tensors as numbers or lists) at `path`, fsynced."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(_jsonable(data), fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This process's RNG states: tensors (torch, CUDA, numpy's key) and JSON (the rest)."""
    import numpy as np

    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    tensors["numpy"] = torch.from_numpy(np.asarray(key, dtype=np.uint32).astype(np.int64))
    meta = {"python": _jsonable(random.getstate()), "numpy": [kind, pos, has_gauss, gauss]}
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda.")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    version, state, gauss = meta["python"]
    random.setstate((version, tuple(state), gauss))
    kind, pos, has_gauss, cached = meta["numpy"]
    key = tensors["numpy"].numpy().astype(np.uint32)
    np.random.set_state((kind, key, pos, has_gauss, cached))


def own_files(path: Path) -> list[str]:
    """The files of the checkpoint `path` this rank wrote: its DCP shards (``dcp/__<rank>_*``) and
    RNG file; on rank 0 also the rest (JSON, ``.metadata``)."""
    r = rank()
    owner = re.compile(rf"^(?:{STATE_DIR}/__(\d+)_|rng-(\d+)\.)")
    found = [(f, owner.match(f)) for f in ck.files(path)]
    return [f for f, m in found if (int(m[1] or m[2]) if m else 0) == r]


@dataclass
class State:
    """What a checkpoint holds besides each rank's RNG: the model and optimizer (DCP), the
    learning-rate scheduler (JSON), and what `write` puts in the checkpoint directory on rank 0
    (the Trainer's ``trainer_state.json``; a loop's own state). `export` is called on every rank
    at the final save (the Trainer's ``save_model``)."""

    model: Any
    optimizer: Any
    scheduler: Any = None
    write: Callable[[Path], None] | None = None
    export: Callable[[Path], None] | None = None


def state_of(obj: Any) -> State:
    """`obj` itself when it is a `State`; else a Trainer's (anything with ``model``,
    ``optimizer``, ``lr_scheduler``, ``state.save_to_json`` and perhaps ``save_model``)."""
    if isinstance(obj, State):
        return obj
    save_model = getattr(obj, "save_model", None)
    return State(
        obj.model,
        obj.optimizer,
        getattr(obj, "lr_scheduler", None),
        write=lambda path: obj.state.save_to_json(str(path / "trainer_state.json")),
        export=(lambda path: save_model(str(path))) if save_model is not None else None,
    )


def write_small(path: Path, state: Any, plain: dict[str, Any]) -> None:
    """Each rank's RNG file; on rank 0 the optimizer groups, the scheduler and `State.write`'s
    files. `state` is a `State` or a Trainer (`state_of`)."""
    from safetensors.torch import save_file

    parts = state_of(state)
    path.mkdir(parents=True, exist_ok=True)
    tensors, meta = capture_rng()
    save_file(tensors, str(path / f"rng-{rank()}.safetensors"), metadata={"json": json.dumps(meta)})
    if rank() == 0:
        write_json(path / "optimizer.json", plain)
        if parts.scheduler is not None:
            write_json(path / "scheduler.json", parts.scheduler.state_dict())
        if parts.write is not None:
            parts.write(path)


def load(path: Path, state: Any, adapter_only: bool) -> None:
    """Load model, optimizer and scheduler from the checkpoint `path` into `state` (a `State` or a
    Trainer), resharding when the world size changed. RNG states are restored separately
    (`load_rng`); `State.write`'s files are read by whoever wrote them."""
    parts = state_of(state)
    model, optimizer = parts.model, parts.optimizer
    state, plain = split_state(model, optimizer, adapter_only)
    with quiet():
        dcp.load(state, storage_reader=SafeReader(path / STATE_DIR))
    saved = json.loads((path / "optimizer.json").read_text(encoding="utf-8"))
    groups = plain["param_groups"]
    if len(saved["param_groups"]) != len(groups):
        raise CheckpointError(
            f"{path} holds {len(saved['param_groups'])} optimizer param groups; this run has "
            f"{len(groups)}: resume with the same optimizer settings"
        )
    for group, kept in zip(groups, saved["param_groups"], strict=True):
        for key, value in kept.items():
            if key != "params":
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value
    optim: dict[str, Any] = {
        fqn: {**tensors, **saved["state"].get(fqn, {})} for fqn, tensors in state["optim"].items()
    }
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict={"state": optim, "param_groups": groups},
        options=_options(adapter_only),
    )
    sched = parts.scheduler
    if sched is not None and (path / "scheduler.json").exists():
        sched.load_state_dict(json.loads((path / "scheduler.json").read_text(encoding="utf-8")))


def _json_object(path: Path, *keys: str) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or any(k not in data for k in keys):
        raise ValueError(f"{path.name}: not the JSON object tgnb writes")
    return data


def probe(path: Path, ckpt: ck.Checkpoint) -> str:
    """Why the verified checkpoint `ckpt` at `path` could not be loaded ("" when it can): its DCP
    metadata (read by `SafeReader`), the files that metadata names (each must be in the manifest,
    so checksummed), and the JSON and RNG files `load` and the Trainer (or a loop) read. Only what the files
    say is read; no tensor is loaded."""
    listed = {e.path for e in ckpt.files}
    try:
        metadata = SafeReader(path / STATE_DIR).read_metadata()
        names = {info.relative_path for info in (metadata.storage_data or {}).values()}
        if unlisted := sorted(
            f"{STATE_DIR}/{n}" for n in names if f"{STATE_DIR}/{n}" not in listed
        ):
            return f"{unlisted[0]}: named by the DCP metadata but not in the manifest"
        saved = _json_object(path / "optimizer.json", "param_groups", "state")
        if not isinstance(saved["param_groups"], list) or not isinstance(saved["state"], dict):
            return "optimizer.json: not the JSON object tgnb writes"
        if "scheduler.json" in listed:
            _json_object(path / "scheduler.json")
        if "loop.json" in listed:  # a `tgnb.train.Checkpointer` loop's own state
            _json_object(path / "loop.json", "step", "states")
        elif "lightning.json" in listed:  # a protected Lightning Trainer's fit loop
            _json_object(path / "lightning.json", "step", "fit_loop")
        else:  # a Trainer's
            _json_object(path / "trainer_state.json", "global_step")
        from safetensors import safe_open

        for rel in sorted(r for r in listed if re.fullmatch(r"rng-\d+\.safetensors", r)):
            with safe_open(str(path / rel), framework="pt") as fh:
                json.loads((fh.metadata() or {})["json"])
    except Exception as exc:  # whatever it is, the checkpoint cannot be used
        first = (str(exc).splitlines() or [""])[0][:200]
        return f"cannot be loaded: {type(exc).__name__}: {first}"
    return ""


def load_rng(path: Path) -> bool:
    """Restore this rank's RNG states (rank 0's when the checkpoint has none for this rank: it was
    saved with fewer ranks). False when there is none at all."""
    from safetensors import safe_open

    for r in (rank(), 0):
        f = path / f"rng-{r}.safetensors"
        if f.exists():
            with safe_open(str(f), framework="pt") as fh:
                tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
                meta = json.loads((fh.metadata() or {})["json"])
            restore_rng(tensors, meta)
            return True
    return False
