"""Checkpoint costs of tgnb's one checkpoint path (DCP), as ratios to plain I/O measured side by side.

    python bench/checkpoint.py [--params 1e6,25e6,100e6] [--ranks 1,2] [--dir DIR]

For each size (a stack of square ``Linear`` layers with AdamW state: weights + 2 moments, fp32) and
rank count (gloo processes on this machine, each holding the whole model as DDP would), every rank
runs the real `tgnb.train.saving.Saver` and `tgnb.train.dcpio.load` and measures:

- (a) ``async stall / sync stall``: the time training is held by a periodic asynchronous save
  (staging to CPU memory) over the time a synchronous save of the same state holds it (write,
  fsync, marker). Target <= 0.10 (issue 32).
- (b) ``preempt / plain``: from the stop decision at a step boundary to the sealed marker (a
  synchronous save: every rank's shard written, fsynced and checksummed by that rank as it is written
  -- no byte read back, `tgnb.train.hashwriter` --, rank 0's manifest and marker), over a plain
  parallel write + fsync of the same bytes by the same ranks (DCP splits a replicated state evenly
  between them). Target <= 1.1 (issue 32). Also over a plain write of the state's own tensors from
  where they live (``--device cuda``: copied to host memory, then written and fsynced; on the CPU
  the first write again, but reading the state's own memory instead of one reused 16 MiB buffer:
  about 0.3 s more at 100M), the least any checkpoint of a GPU's state does: on an H200 the sealed
  checkpoint took 1.83x the write of bytes already in host memory (2026-12-04), which leaves out
  that copy. Most of the extra over a plain write is the CRC32 ``torch.save`` computes for each
  item DCP writes, which only a process-wide switch turns off (docs/benchmarks.md). The signal's
  delivery and the rest
  of the step in progress are not included (they are the same for any writer), nor the removal of
  older checkpoints that follows the marker (about 0.2 s for 1.2 GB here).
- (c) ``load / plain``: a resume's load (DCP read, reshard, into model and optimizer) over a plain
  read of the same files (every rank holds the whole state here, as under DDP, so each reads all of
  it), twice: cold, the files' cached pages evicted before each with ``posix_fadvise(DONTNEED)``
  (no privilege needed; a resume on a new node reads cold; the plain read asks its file ahead in
  4 MiB ranges as tgnb's loader asks for its items), and warm, both from the page cache. Target
  <= 1.5: met cold (about 1.0 at 100M, 2026-12-01). Warm it is not met with DCP's public readers:
  ``FileSystemReader`` ``torch.load``s every item into a new tensor and copies it into the live one
  (two passes over the bytes, fresh memory, about 0.3 ms per item) where the plain read makes one
  pass: 3-5x. The HF safetensors reader/writer pair halves the load but doubles the save.

The default sizes stop at 100M parameters on this 2-core machine (350M: ``--params 350e6``, about
4 GB per save and rank). Each figure is the median of ``--repeats``, after one synchronous and one
asynchronous save not counted (the first asynchronous save allocates the CPU staging copy that the
later ones reuse; training pays that once). Prints one row per case, then JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _model(params: float) -> Any:
    import torch

    width = 1024 if params >= 5e6 else 256
    layers = max(1, round(params / (width * width)))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    model = model.to(os.environ.get("TGNB_BENCH_DEVICE", "cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)  # gradients are not checkpointed: free them (350M x 2 fits)
    return model, opt


def _write_fsynced(d: Path, chunks: Iterable[Any]) -> float:
    """Seconds to write `chunks` (buffers, made as they are asked for) to one file in `d`, then
    fsync it and `d`."""
    began = time.perf_counter()
    fd = os.open(d / f"plain-{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for chunk in chunks:
        view = memoryview(chunk)
        while len(view):
            view = view[os.write(fd, view) :]
    os.fsync(fd)
    os.close(fd)
    dfd = os.open(d, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    return time.perf_counter() - began


def _plain_write(d: Path, nbytes: int) -> float:
    """`nbytes` from host memory."""
    buf = memoryview(os.urandom(1 << 20) * 16)
    return _write_fsynced(d, (buf[: nbytes - at] for at in range(0, nbytes, len(buf))))


def _plain_write_from_device(d: Path, tensors: list[Any]) -> float:
    """`_plain_write` of the state's own tensors from where they live: each copied to host memory
    (``.cpu()``: device to host on a GPU, nothing on the CPU) as it is written. On a GPU this is
    the least any checkpoint of that state does; `_plain_write` writes bytes already in host
    memory."""
    import torch

    host = (t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy() for t in tensors)
    return _write_fsynced(d, host)


def _state_tensors(model: Any, opt: Any, rank: int, world: int) -> list[Any]:
    """This rank's share of the model's and optimizer's tensors (every `world`-th one: DCP also
    splits a replicated state between the ranks)."""
    import torch

    mine = [*model.state_dict().values()]
    mine += [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return mine[rank::world]


def _evict(files: list[Path]) -> None:
    """Drop the files' pages from the page cache (clean pages only: they were fsynced)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _plain_read(files: list[Path]) -> float:
    """Read the files whole, each asked ahead first in 4 MiB ranges (``WILLNEED``, as tgnb's
    loader asks for its items: on this virtual disk many ranges in flight read about 2.5x faster
    than one sequential stream)."""
    began = time.perf_counter()
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            for offset in range(0, f.stat().st_size, 4 << 20):
                os.posix_fadvise(fh.fileno(), offset, 4 << 20, os.POSIX_FADV_WILLNEED)
            while fh.read(16 << 20):
                pass
    return time.perf_counter() - began


def _rank_main(rank: int, world: int, store: str, params: float, root: str, repeats: int) -> None:
    import torch
    import torch.distributed as dist
    from transformers import TrainerState

    from tgnb.train import dcpio
    from tgnb.train.record import Recorder
    from tgnb.train.saving import Saver

    os.environ["RANK"] = str(rank)
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    base = Path(root)
    model, opt = _model(params)
    trainer = SimpleNamespace(model=model, optimizer=opt, lr_scheduler=None, state=TrainerState())
    recorder = Recorder(base)
    recorder.enabled = False  # no events file, no @tgnb lines: the bench prints its own
    saver = Saver(base / "checkpoints", recorder, keep_last=1)
    meta = {"world_size": world, "global_batch": world, "samples": 0, "adapter_only": False}

    def barrier() -> None:
        if world > 1:
            dist.barrier()

    step = 0
    for sync in (True, False):  # warm-up: the first asynchronous save allocates the staging copy
        step += 1
        saver.save(trainer, step, "periodic", meta, sync=sync)
        saver.wait()
    rows: dict[str, list[float]] = {k: [] for k in ("sync", "async", "preempt", "plain_w")}
    rows["plain_w_dev"] = []
    rows.update(load=[], plain_r=[], load_cold=[], plain_r_cold=[])
    for _ in range(repeats):
        for mode in ("sync", "async", "preempt"):
            step += 1
            barrier()
            began, wall = time.perf_counter(), time.time()
            saver.save(trainer, step, "periodic", meta, sync=mode != "async")
            stall = time.perf_counter() - began
            saver.wait()
            barrier()
            assert saver.last is not None  # rank 0: the marker's time (older ones removed after)
            rows[mode].append(stall if mode != "preempt" else saver.last.time - wall)
        last = saver.last
        assert last is not None
        path = base / "checkpoints" / f"checkpoint-{step}"
        mine = [f for f in path.rglob("*") if f.is_file()]
        nbytes = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) // world
        barrier()
        rows["plain_w"].append(_plain_write(base, nbytes))
        barrier()
        rows["plain_w_dev"].append(
            _plain_write_from_device(base, _state_tensors(model, opt, rank, world))
        )
        for cold in (False, True):
            suffix = "_cold" if cold else ""
            barrier()
            if cold:
                _evict(mine)
                barrier()
            began = time.perf_counter()
            dcpio.load(path, trainer, adapter_only=False)
            rows["load" + suffix].append(time.perf_counter() - began)
            barrier()
            if cold:
                _evict(mine)
                barrier()
            # every rank holds (and reads) the whole state
            rows["plain_r" + suffix].append(_plain_read(mine))
        barrier()
        (base / f"plain-{os.getpid()}").unlink(missing_ok=True)
    if rank == 0:
        med = {k: statistics.median(v) for k, v in rows.items()}
        med["bytes"] = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        (base / "result.json").write_text(json.dumps(med))
    if world > 1:
        dist.destroy_process_group()


def measure(params: float, world: int, repeats: int, parent: str | None) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(dir=parent) as root:
        store = os.path.join(root, "store")
        if world == 1:
            _rank_main(0, 1, store, params, root, repeats)
        else:
            mp.spawn(_rank_main, args=(world, store, params, root, repeats), nprocs=world)
        med = json.loads(Path(root, "result.json").read_text())
    return {
        "params": params,
        "ranks": world,
        "bytes": med["bytes"],
        "sync_stall_ms": 1e3 * med["sync"],
        "async_stall_ms": 1e3 * med["async"],
        "a_async_over_sync": med["async"] / med["sync"],
        "preempt_ms": 1e3 * med["preempt"],
        "plain_write_ms": 1e3 * med["plain_w"],
        "b_preempt_over_plain": med["preempt"] / med["plain_w"],
        "plain_write_from_device_ms": 1e3 * med["plain_w_dev"],
        "b_preempt_over_plain_from_device": med["preempt"] / med["plain_w_dev"],
        "load_ms": 1e3 * med["load"],
        "plain_read_ms": 1e3 * med["plain_r"],
        "c_load_over_plain": med["load"] / med["plain_r"],
        "load_cold_ms": 1e3 * med["load_cold"],
        "plain_read_cold_ms": 1e3 * med["plain_r_cold"],
        "c_cold_load_over_plain": med["load_cold"] / med["plain_r_cold"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", default="1e6,25e6,100e6")
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: the temp directory)")
    p.add_argument("--device", default="cpu", help="where the state lives (cuda on a GPU machine)")
    args = p.parse_args(argv)
    os.environ["TGNB_BENCH_DEVICE"] = args.device  # the rank processes inherit it
    out = []
    for params in (float(x) for x in args.params.split(",")):
        for world in (int(x) for x in args.ranks.split(",")):
            row = measure(params, world, args.repeats, args.dir)
            out.append(row)
            print(
                f"{params / 1e6:7.1f}M x{world}  {row['bytes'] / 2**20:8.1f} MiB  "
                f"(a) {row['async_stall_ms']:8.1f} / {row['sync_stall_ms']:8.1f} ms = "
                f"{row['a_async_over_sync']:.3f}  (b) {row['preempt_ms']:8.1f} / "
                f"{row['plain_write_ms']:8.1f} ms = {row['b_preempt_over_plain']:.2f}, from the "
                f"device {row['b_preempt_over_plain_from_device']:.2f}  "
                f"(c) {row['load_ms']:8.1f} / {row['plain_read_ms']:8.1f} ms = "
                f"{row['c_load_over_plain']:.2f}, cold {row['load_cold_ms']:8.1f} / "
                f"{row['plain_read_cold_ms']:8.1f} ms = {row['c_cold_load_over_plain']:.2f}",
                flush=True,
            )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
