"""The express checkpoint: what a preemption writes, as one file into space allocated beforehand.

A preempted process has seconds (Kubernetes' grace period) or minutes (a Slurm drain) to save, and
every millisecond of it is a millisecond of the step in progress thrown away. For a small model
most of the cost of a Trainer checkpoint is not its bytes but its five new files (each allocated
and flushed on its own) and ``torch.save``'s container. So the checkpoint `tgnb.train.immediate`
takes on a signal or drain notice (and a step-boundary one taken for the same reason) is instead:

- one file, `STATE_FILE`, in the safetensors format: the model's tensors (``model/<name>``), the
  optimizer's per-parameter state (``optimizer/<index>/<key>``), the RNG states' tensors
  (``rng/<kind>``), ``__log__`` (the trainer state's log history, as pickled chunks),
  ``__meta__`` (a pickle of the rest: param groups, the scheduler's state dict, the other RNG
  states, the ``TrainerState``; `tgnb.train.metadata`) and ``__pad__``, zeros up to the file's
  size;
- written into `SPARE`, a directory that `SpareKeeper` keeps allocated beside training: its file
  written with zeros to the expected size and fsynced, and a blank marker. The snapshot overwrites
  blocks that exist on disk and pages already in the cache, so its flush is a flush of data only,
  with no block allocation (``bench/checkpoint_floor.py`` measures the difference: ``plain``
  against ``prealloc_data``);
- sealed there by the usual completion marker (`tgnb.train.checkpoint`), written over the blank
  one in place as soon as the data is durable, then renamed to ``checkpoint-<step>``. Sealing
  before the rename keeps a journal commit (the rename's, which on ext4 waits for the data) off
  the way to a complete checkpoint: two flushes of data in place are all it waits for. A sealed
  spare is a complete checkpoint under its own name (`tgnb.train.checkpoint.STAGING`):
  `tgnb.train.checkpoint.checkpoint_dirs` lists it, and `adopt_sealed` renames it if the process
  stopped before it did. Once renamed it is complete, torn or rotated like any other
  checkpoint.

The Trainer cannot resume from it directly: `expand` writes it out in the Trainer's layout
(``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``,
``trainer_state.json``) for ``train(resume_from_checkpoint=...)``, which
`tgnb.train.preemption.CheckpointGuard.resume_from` does. The pickle is read back only from a
checkpoint that passed its manifest checksums; like the Trainer's own ``rng_state.pth`` it is
trusted as the run's own output. Periodic and final checkpoints keep the Trainer's layout.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pickle
import shutil
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tgnb.train import checkpoint as ck
from tgnb.train import fastsave, metadata
from tgnb.train.plan import Plan, unwatch_modules, watch_modules

__all__ = [
    "SPARE",
    "STATE_FILE",
    "SpareKeeper",
    "adopt_sealed",
    "expand",
    "is_express",
    "load",
    "prepare_spare",
    "spare_size",
    "write",
]

#: The one file of an express checkpoint.
STATE_FILE = "tgnb-state.safetensors"
#: The directory holding the file allocated for the next express checkpoint (under checkpoints/).
SPARE = ck.STAGING
FORMAT = "tgnb-express-2"
_FORMATS = (FORMAT, "tgnb-express-1")  # 1: the log history inside the metadata, no __log__
_LOG = "__log__"
_META = "__meta__"
_PAD = "__pad__"
#: Extra room in the spare for a state that grows (the trainer state's log history): at least
#: this many bytes, and at least twice the metadata.
_SPARE_SLACK = 64 << 10
_ZEROS = bytes(1 << 20)
_IOV_MAX = 1024


class _State:
    """What an express checkpoint of `trainer` holds, taken apart: `tensors` -- the model's
    (``model/<name>``), the optimizer's per-parameter state (``optimizer/<index>/<key>``) and the
    RNG states' (``rng/<kind>``) -- and the rest, pickled by `meta`: the optimizer's param groups
    and non-tensor state, the scheduler's state dict, the other RNG states and the
    ``TrainerState`` without its log history (a tensor left in them is pickled inline;
    `tgnb.train.metadata`). With a valid `plan`, `tensors` holds the RNG states' only: the
    model's and optimizer's are the plan's."""

    def __init__(self, trainer: Any, rng: dict[str, Any], plan: Plan | None = None) -> None:
        import torch

        self._trainer = trainer
        self._plan = plan
        tensors: dict[str, Any] = {}
        if plan is None:  # else the model's and optimizer's tensors are the plan's, checked then
            fastsave.check_supported(trainer)
            tensors.update(
                (f"model/{k}", t) for k, t in fastsave.model_tensors(trainer.model).items()
            )
            osd = trainer.optimizer.state_dict()
            rest: dict[Any, dict[str, Any]] = {}
            for index, entry in osd["state"].items():
                kept = rest[index] = {}
                for key, value in entry.items():
                    if isinstance(value, torch.Tensor) and isinstance(index, int):
                        tensors[f"optimizer/{index}/{key}"] = value
                    else:
                        kept[key] = value
            self._optimizer = {**osd, "state": rest}
        self._rng_rest = {}
        for kind, value in rng.items():
            if isinstance(value, torch.Tensor):
                tensors[f"rng/{kind}"] = value
            else:
                self._rng_rest[kind] = metadata.pack_rng(kind, value)
        self._rng_order = list(rng)
        self.tensors = tensors

    def meta(self) -> bytes:
        plan = self._plan
        optimizer = plan.optimizer_rest() if plan is not None else self._optimizer
        return metadata.meta(self._trainer, self._rng_rest, self._rng_order, optimizer)


#: The header entry of a tensor up to its offsets, by (name, dtype, shape): the spare's keeper
#: makes them every `SpareKeeper.CHECK_EVERY` steps, so the snapshot finds them made.
_ENTRIES: dict[tuple[str, Any, Any], str] = {}


def _entry(name: str, t: Any) -> str:
    key = (name, t.dtype, t.shape)
    try:
        return _ENTRIES[key]
    except KeyError:
        pass
    code = fastsave.dtype_code(t)
    if code is None or t.is_meta:
        raise fastsave.Unsupported(f"{name} is a {t.dtype} tensor on {t.device}")
    plain = name.isprintable() and '"' not in name and "\\" not in name
    quoted = f'"{name}"' if plain else json.dumps(name)
    shape = ",".join(map(str, t.shape))
    if len(_ENTRIES) > 1 << 16:
        _ENTRIES.clear()
    entry = _ENTRIES[key] = f'{quoted}:{{"dtype":"{code}","shape":[{shape}],"data_offsets":['
    return entry


def _u8(name: str, start: int, n: int) -> str:
    return f'"{name}":{{"dtype":"U8","shape":[{n}],"data_offsets":[{start},{start + n}]}}'


class _Layout:
    """The file's layout, in one pass over the tensors (after those of `base`, a layout made
    earlier): their bytes (`views`, borrowed from the tensors: keep them alive) from offset 0 of
    the data, then the log history's chunks, the metadata, a pad. The header's JSON for the
    tensors is made here; the three last entries are appended as text by `encode`, once their
    sizes are known, into the `width` reserved for the header."""

    def __init__(self, tensors: dict[str, Any], base: _Layout | None = None) -> None:
        if base is None:
            parts = [f'{{"__metadata__":{{"format":"{FORMAT}"}}']
            views: list[Any] = []
            offset = 0
        else:  # `tensors` follow base's
            parts, views, offset = [base._prefix], list(base.views), base.data
        for name, t in tensors.items():
            n = t.nbytes
            parts.append(f"{_entry(name, t)}{offset},{offset + n}]}}")
            if n:
                views.append(fastsave.bytes_view(t))
            offset += n
        self.views: list[Any] = views
        self.data: int = offset  # the tensors' bytes
        self._prefix: str = ",".join(parts)

    def _tail(self, log: int, meta: int, pad: int) -> str:
        at = self.data
        return (
            f",{_u8(_LOG, at, log)},{_u8(_META, at + log, meta)},"
            f"{_u8(_PAD, at + log + meta, pad)}}}"
        )

    def width(self, at_most: int) -> int:
        """Bytes to reserve for the header (length prefix included) when the log, the metadata
        and the pad are each at most `at_most` bytes."""
        n = len(self._prefix) + len(self._tail(at_most, at_most, at_most))
        return 8 + n + (-n % 8)

    def encode(self, log: int, meta: int, pad: int, width: int) -> bytes:
        raw = (self._prefix + self._tail(log, meta, pad)).encode()
        raw += b" " * (width - 8 - len(raw))
        return struct.pack("<Q", len(raw)) + raw


def make_plan(trainer: Any) -> Plan | None:
    """A `Plan` of `trainer`'s state with its layout made (None: no plan for this trainer)."""
    plan = Plan.make(trainer)
    if plan is not None:
        plan.layout = _Layout(plan.tensors)
    return plan


def _log_chunks(trainer: Any, log: metadata.LogHistory | None) -> list[bytes]:
    """`trainer`'s log history pickled: what `log` has not pickled yet, else all of it."""
    return (log or metadata.LogHistory()).update(trainer.state.log_history)


def _layout(trainer: Any, rng: dict[str, Any], plan: Plan | None) -> tuple[_State, _Layout]:
    if plan is not None and not plan.valid():
        plan = None
    state = _State(trainer, rng, plan)
    return state, _Layout(state.tensors, plan.layout if plan is not None else None)


def spare_size(
    trainer: Any,
    rng: dict[str, Any],
    plan: Plan | None = None,
    log: metadata.LogHistory | None = None,
) -> tuple[int, int]:
    """The bytes the express checkpoint of `trainer` takes now, and the size to allocate."""
    state, lay = _layout(trainer, rng, plan)
    meta = len(state.meta()) + sum(map(len, _log_chunks(trainer, log)))
    need = lay.width(1 << 50) + lay.data + meta
    room = need + max(_SPARE_SLACK, 2 * meta)
    return need, -(-room // 4096) * 4096


def prepare_spare(ckpt_dir: Path, size: int, lock: threading.Lock | None = None) -> Path:
    """Make `SPARE` under `ckpt_dir` hold a `STATE_FILE` of `size` zero bytes, on disk (written
    and fsynced under a temporary name, then swapped in while holding `lock`)."""
    spare = ckpt_dir / SPARE
    tmp = ckpt_dir / f"{SPARE}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fd = os.open(tmp / STATE_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _pwrite_all(fd, _zeros(size), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(tmp / ck.MARKER, "wb") as fh:  # blank: written over by the seal, in place
        fh.write(b" " * ck.BLANK_MARKER_BYTES)
        os.fsync(fh.fileno())
    ck.fsync_path(tmp)
    with lock or contextlib.nullcontext():
        adopt_sealed(ckpt_dir)  # never delete a checkpoint sealed there
        shutil.rmtree(spare, ignore_errors=True)
        os.rename(tmp, spare)
        ck.fsync_path(ckpt_dir)
    return spare


class SpareKeeper:
    """Decides whether a preemption's checkpoint is an express one, and keeps `SPARE` allocated
    for it, big enough for the state as it grows (the trainer state's log history does).

    Every `CHECK_EVERY` steps the main thread measures what an express checkpoint would take now
    (about 0.3 ms for the tiny model) and remakes `plan` (`tgnb.train.plan`), which spares the
    snapshot taking the state dicts apart while the model is unchanged. Under `MAX_BYTES`
    (`usable`), where new files and flushes cost more than the bytes, a thread prepares a bigger
    spare when the state outgrew it. Larger
    states keep the Trainer's layout, whose big files go to disk with ``O_DIRECT``
    (`tgnb.train.fastsave`): as fast as a plain write there, without a spare as big as the model
    kept on disk and in the page cache. `lock` is held by the snapshot while it writes.
    """

    CHECK_EVERY = 32
    MAX_BYTES = fastsave.DIRECT_MIN_BYTES

    def __init__(self, ckpt_dir: Path) -> None:
        self.ckpt_dir = ckpt_dir
        self.size = 0
        self.lock = threading.Lock()
        self.usable = False  # measured, and small enough for an express checkpoint
        self.plan: Plan | None = None  # remade at each measure; valid until the model changes
        self.log = metadata.LogHistory()  # brought up to date at each measure
        self._checked: int | None = None
        self._thread: threading.Thread | None = None
        watch_modules()
        self._watching = True

    def step_end(self, trainer: Any, rng: dict[str, Any], step: int) -> None:
        """At a step boundary (main thread): grow the spare in the background if it is due."""
        if self._checked is not None and (
            not self.usable or step - self._checked < self.CHECK_EVERY
        ):
            return  # too big for an express checkpoint (measured once), or not due yet
        if self._thread is not None and self._thread.is_alive():
            return
        self._checked = step
        try:
            self.plan = make_plan(trainer)
            need, room = spare_size(trainer, rng, self.plan, self.log)
        except fastsave.Unsupported:
            need = room = self.MAX_BYTES
        self.usable = need < self.MAX_BYTES
        if not self.usable:
            self.plan = None
        if (
            self.usable and need + _SPARE_SLACK // 2 > self.size
        ):  # grow before the state outgrows it
            self.size = room
            self._thread = threading.Thread(
                target=self._prepare, args=(room,), name="tgnb-spare", daemon=True
            )
            self._thread.start()

    def retire(self) -> None:
        """Neither write into the spare nor prepare another any more: it holds a checkpoint
        sealed in place that could not be renamed (`close` tries again, `adopt_sealed`)."""
        self.usable = False
        self._checked = -1  # measured: `step_end` does nothing

    def _prepare(self, size: int) -> None:
        try:
            prepare_spare(self.ckpt_dir, size, self.lock)
        except OSError as exc:  # the snapshot then writes a new file: slower, still complete
            print(f"tgnb: could not allocate the spare checkpoint: {exc}", file=sys.stderr)

    def close(self) -> None:
        """Wait for a preparation in progress, then free the spare's disk space."""
        if self._thread is not None:
            self._thread.join()
        if self._watching:
            self._watching = False
            self.plan = None
            unwatch_modules()
        shutil.rmtree(self.ckpt_dir / f"{SPARE}.tmp", ignore_errors=True)
        try:
            adopt_sealed(self.ckpt_dir)  # a checkpoint sealed there is kept, under its name
        except OSError as exc:
            print(f"tgnb: could not rename the sealed spare checkpoint: {exc}", file=sys.stderr)
        else:
            shutil.rmtree(self.ckpt_dir / SPARE, ignore_errors=True)


def adopt_sealed(ckpt_dir: Path) -> Path | None:
    """Give a checkpoint sealed in the spare but not renamed (its process stopped between the
    two) its name ``checkpoint-<step>``, durably. A torn directory of that name is replaced; a
    complete one is kept and the spare's copy dropped. Returns the checkpoint's path, or None
    when the spare holds none."""
    spare = ckpt_dir / SPARE
    staged = ck.read_marker(spare)
    if staged is None:
        return None
    dest = ckpt_dir / f"{ck.PREFIX}{staged.step}"
    if dest.exists():
        if ck.verify(dest, checksums=False) is not None:
            ck._remove(spare)
            ck.fsync_path(ckpt_dir)
            return dest
        ck._remove(dest)
    _rename_durable(spare, dest)
    return dest


def _zeros(n: int) -> list[memoryview]:
    """`n` zero bytes, as views of one shared buffer."""
    return [memoryview(_ZEROS)[: min(n - i, len(_ZEROS))] for i in range(0, n, len(_ZEROS))]


def _pwrite_all(fd: int, views: list[Any], offset: int) -> int:
    """Write `views` (buffers) in order from `offset` (few ``pwritev`` calls); returns the end
    offset."""
    todo = [v for v in views if len(v)]
    while todo:
        batch = todo[:_IOV_MAX]
        done = os.pwritev(fd, batch, offset)
        offset += done
        i = 0
        while i < len(batch) and done >= len(batch[i]):
            done -= len(batch[i])
            i += 1
        todo = todo[i:]
        if done:
            todo[0] = memoryview(todo[0]).cast("B")[done:]
    return offset


def write(
    trainer: Any,
    dest: Path,
    rng: dict[str, Any],
    algorithm: str | None = None,
    seal: Callable[[list[ck.FileEntry]], bytes] | None = None,
    plan: Plan | None = None,
    durable: Callable[[], None] | None = None,
    log: metadata.LogHistory | None = None,
) -> list[ck.FileEntry]:
    """Write `trainer`'s express checkpoint as the new directory `dest` (in the spare next to it
    when there is one, then renamed), its file and name durable. `rng` is the RNG states of the
    step boundary it is of; `plan`, one made at an earlier boundary (`make_plan`), is used when it
    is still valid; `log`, the log history pickled so far (`tgnb.train.metadata`), is brought up
    to date (else all of it is pickled). `seal`, when given, makes the marker's bytes for the
    file's manifest entry; the marker is then written as soon as the data is durable, and
    `durable` called once it is (before the spare's rename). Returns the manifest entry.

    All in this thread, with the disk working beside it: the tensors are written first and their
    writeback started (``sync_file_range``), so that the device writes them while the metadata is
    pickled and the checksum taken; then one flush. (The flush and the write in another thread
    measured slower: with the main thread and the math library's threads about, that thread
    waited for a CPU until this one blocked.)
    """
    algo = algorithm or ck.default_algorithm()
    digest = ck._hasher(algo)
    cloexec = getattr(os, "O_CLOEXEC", 0)
    # what cannot be written raises Unsupported here, before any I/O
    state, lay = _layout(trainer, rng, plan)
    chunks = _log_chunks(trainer, log)
    nlog = sum(map(len, chunks))
    # paths as strings: each pathlib operation costs tens of microseconds in a preemption's save
    spare: str | None = os.path.join(os.path.dirname(dest) or ".", SPARE)
    try:
        fd = os.open(f"{spare}/{STATE_FILE}", os.O_WRONLY | cloexec)
    except OSError:
        fd = -1
    if fd >= 0:
        room = os.fstat(fd).st_size
    else:
        room, spare = 0, None
        dest.mkdir(parents=True)
        fd = os.open(dest / STATE_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | cloexec, 0o644)
    try:
        width = lay.width(max(room, 1 << 40))
        _write_early(fd, [*lay.views, *chunks], width)
        meta = memoryview(state.meta())
        end = width + lay.data + nlog + len(meta)
        pad = max(0, room - end)
        head = memoryview(lay.encode(nlog, len(meta), pad, width))
        zeros = _zeros(pad)
        # the spare's pad is zeros on disk already: only a new file's is written
        _pwrite_all(fd, [meta] if spare is not None else [meta, *zeros], end - len(meta))
        os.pwrite(fd, head, 0)
        start_writeback(fd, 0, 0)  # the metadata and the header, while the checksum is taken
        for view in (head, *lay.views, *chunks, meta, *zeros):
            digest.update(view)
        entries = [ck.FileEntry(STATE_FILE, end + pad, digest.hexdigest(), algo)]
        raw = seal(entries) if seal is not None else None
        os.fdatasync(fd)
    finally:
        os.close(fd)
    if spare is None:
        _rename_durable(None, dest)  # the new directory's names, before its marker
    if raw is not None:
        ck.put_marker(spare or dest, raw)  # over the blank one: two flushes of data, in place
        if durable is not None:
            durable()  # complete: in the spare, a checkpoint under its staging name until renamed
    if spare is not None:
        _rename_durable(spare, dest)
    return entries


def _write_early(fd: int, views: list[Any], offset: int) -> None:
    """Write `views` from `offset` and start their writeback (``sync_file_range``), so that the
    device writes them while the metadata is pickled and the flush that makes the file durable
    finds less to do (measured on these VMs: 0.1-0.2 ms left of 0.35-0.45 ms)."""
    end = _pwrite_all(fd, views, offset)
    start_writeback(fd, offset, end - offset)


_SYNC_FILE_RANGE_WRITE = 2


def _libc_sync_file_range() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
        call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        call.restype = ctypes.c_int
        return call
    return None


_sync_file_range = _libc_sync_file_range()  # looked up now, not during a preemption's save


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing bytes ``[offset, offset + nbytes)`` of `fd` to disk and
    return at once (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``). Not a flush: durability
    still needs fsync/fdatasync. Does nothing where the call is missing; its errors are left to
    that flush."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)


def _rename_durable(spare: str | Path | None, dest: Path) -> None:
    """Give the spare directory its checkpoint name (or, None: flush the new `dest`'s entries),
    and make that name durable."""
    if spare is not None:
        os.rename(spare, dest)
    else:
        ck.fsync_path(dest)
    ck.fsync_path(os.path.dirname(dest) or ".")


def is_express(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / STATE_FILE).is_file()


def load(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's tensors and the training state of the express checkpoint in directory `path`:
    ``optimizer`` and ``scheduler`` state dicts, ``rng`` states, ``trainer_state`` (a
    ``TrainerState``)."""
    from safetensors import safe_open

    with safe_open(str(Path(path) / STATE_FILE), framework="pt") as f:
        if f.metadata().get("format") not in _FORMATS:
            raise ValueError(f"{path}: not a {FORMAT} checkpoint")
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != _PAD}  # noqa: SIM118
    state = pickle.loads(tensors.pop(_META).numpy().tobytes())
    log = tensors.pop(_LOG, None)
    if log is not None:
        state["trainer_state"].log_history = metadata.read_log(log.numpy().tobytes())
    model: dict[str, Any] = {}
    rng = state["rng"]
    for name, t in tensors.items():
        kind, _, rest = name.partition("/")
        if kind == "model":
            model[rest] = t
        elif kind == "optimizer":
            index, _, key = rest.partition("/")
            state["optimizer"]["state"].setdefault(int(index), {})[key] = t
        elif kind == "rng":
            rng[rest] = t
    state["rng"] = {kind: metadata.unpack_rng(rng[kind]) for kind in state.pop("rng_order")}
    return model, state


def expand(path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Write the express checkpoint in `path` out in the Trainer's layout into the new directory
    `dest` (replaced if it exists), for ``Trainer.train(resume_from_checkpoint=dest)``. Not
    fsynced: it is derived from a durable checkpoint and made again at each resume."""
    import torch
    from safetensors.torch import save_file

    model, state = load(path)
    out = Path(dest)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    torch.save(state["optimizer"], out / "optimizer.pt")
    torch.save(state["scheduler"], out / "scheduler.pt")
    torch.save(state["rng"], out / "rng_state.pth")
    state["trainer_state"].save_to_json(str(out / "trainer_state.json"))
    return out
