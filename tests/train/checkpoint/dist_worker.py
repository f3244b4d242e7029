"""Rank processes for the multi-rank checkpoint tests (gloo on the CPU), run with the real saver
(`tgnb.train.saving.Saver`), the real resume choice (`CheckpointGuard.resume_from`) and the real
loader (`tgnb.train.dcpio.load`). No TRL: a small model stands in for the Trainer's.

``python dist_worker.py reshard RUN_DIR WORLD STEPS OUT_JSON``: FSDP2 (``fully_shard``) over WORLD
ranks; resume from the newest checkpoint (any world size), check the loaded model and optimizer
against the consolidated tensors the saving run wrote beside it, train STEPS steps on a global
batch of 8 (gradient accumulation keeps it at any world size), save (asynchronously half-way,
synchronously at the end) and write the consolidated state and the losses.

``python dist_worker.py kill RUN_DIR SEED OUT_JSON``: 2 ranks (forked) resume, check that what they
loaded is exactly a saved step (every tensor holds the step's value), then save step after step
(alternately asynchronous and synchronous) until the parent SIGKILLs one rank or both at a seeded
random instant (the other one is then killed as torchrun's agent would).

``python dist_worker.py fault ROOT OUT_JSON``: 2 ranks, saves that fail on one rank only
(`fault_rank`); each rank writes ``OUT-<rank>.json``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from tgnb.runs.policy import CheckpointPolicy
from tgnb.train import dcpio, dcpwriter
from tgnb.train.preemption import CheckpointGuard
from tgnb.train.record import Recorder

torch.set_num_threads(1)
GLOBAL_BATCH, MICRO = 8, 2


class TrainerState:
    """The part of transformers' ``TrainerState`` the saver uses (importing transformers would
    cost each rank process seconds)."""

    def __init__(self) -> None:
        self.global_step = 0

    def save_to_json(self, path: str) -> None:
        Path(path).write_text(json.dumps({"global_step": self.global_step}))


def consolidated(model: Any, opt: Any) -> dict[str, torch.Tensor]:
    opts = StateDictOptions(
        full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=True
    )
    msd, osd = get_state_dict(model, opt, options=opts)
    out = {f"model.{k}": v for k, v in msd.items()}
    out.update({f"optim.{k}": v for k, v in osd.items() if isinstance(v, torch.Tensor)})
    return out


def reshard(rank: int, world: int, store: str, run_dir: Path, steps: int, out: Path) -> None:
    from safetensors.torch import load_file, save_file
    from torch.distributed.fsdp import fully_shard

    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = SimpleNamespace(model=model, optimizer=opt, lr_scheduler=None, state=TrainerState())
    guard = CheckpointGuard(
        CheckpointPolicy(watch_drain=False, on_signal=False, allow_fresh_start=True),
        run_dir,
        Recorder(run_dir),
    )
    guard.attach(trainer)
    report: dict[str, Any] = {"world": world}
    start = 0
    if guard.resume_from() is not None:
        assert guard.resumed is not None
        start = guard.resumed.step
        dcpio.load(guard.resumed.path, trainer, adapter_only=False)
        now = consolidated(model, opt)  # every rank takes part; rank 0 gets the tensors
        if rank == 0:
            saved = load_file(str(run_dir / f"consolidated-{start}.safetensors"))
            assert saved.keys() == now.keys(), (sorted(saved), sorted(now))
            report["max_state_diff"] = max(float((saved[k] - now[k]).abs().max()) for k in saved)
        report["resumed_from_world"] = guard.resumed.meta["world_size"]
    saver = guard.saver
    assert saver is not None
    per_rank = GLOBAL_BATCH // world
    losses = []
    for step in range(start + 1, start + steps + 1):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(GLOBAL_BATCH, 16, generator=g), torch.randn(GLOBAL_BATCH, 4, generator=g)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        total = torch.zeros(())
        for i in range(0, per_rank, MICRO):  # gradient accumulation: the global batch stays 8
            xs, ys = x[mine][i : i + MICRO], y[mine][i : i + MICRO]
            loss = ((model(xs) - ys) ** 2).sum() / per_rank
            loss.backward()
            total += loss.detach() * per_rank
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total)
        losses.append(float(total) / GLOBAL_BATCH)
        trainer.state.global_step = step
        meta = {"world_size": world, "global_batch": 8, "samples": 8 * step, "adapter_only": False}
        if step == start + steps // 2 or step == start + steps:
            saver.save(trainer, step, "periodic", meta, sync=step == start + steps)
    saver.wait()
    state = consolidated(model, opt)
    if rank == 0:
        save_file(state, str(run_dir / f"consolidated-{start + steps}.safetensors"))
        report["losses"] = losses
        out.write_text(json.dumps(report))
    guard.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown (gloo's and DCP's threads make it take seconds)


def kill_rank(rank: int, store: str, run_dir: Path, seed: int, ready: Any) -> None:
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = torch.nn.Sequential(*(torch.nn.Linear(128, 128) for _ in range(4)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(1, 128)).sum().backward()
    opt.step()
    trainer = SimpleNamespace(model=model, optimizer=opt, lr_scheduler=None, state=TrainerState())
    guard = CheckpointGuard(
        CheckpointPolicy(watch_drain=False, on_signal=False, keep_last=2, allow_fresh_start=True),
        run_dir,
        Recorder(run_dir),
    )
    guard.attach(trainer)
    step = 0
    if guard.resume_from() is not None:
        assert guard.resumed is not None
        step = guard.resumed.step
        dcpio.load(guard.resumed.path, trainer, adapter_only=False)
        values = {float(p.detach().unique()[0]) for p in model.parameters()}
        for s in opt.state.values():
            values |= {float(s["exp_avg"].unique()[0])}
        if values != {float(step)}:  # a torn or mixed checkpoint
            (run_dir / f"torn-resume-{seed}").write_text(f"step {step}: {sorted(values)}")
    ready.write(f"{step}\n")
    ready.flush()
    saver = guard.saver
    assert saver is not None
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step)
            for s in opt.state.values():
                s["exp_avg"].fill_(step)
        trainer.state.global_step = step
        meta = {"world_size": 2, "global_batch": 2, "samples": 2 * step, "adapter_only": False}
        saver.save(trainer, step, "periodic", meta, sync=step % 2 == 0)


def kill_trial(run_dir: Path, seed: int, out: Path) -> None:
    rng = random.Random(seed)
    store = tempfile.mktemp(prefix="store-", dir=run_dir.parent)
    pipes, pids = [], []
    for rank in (0, 1):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                kill_rank(rank, store, run_dir, seed, os.fdopen(w, "w"))
            finally:
                os._exit(1)
        os.close(w)
        pipes.append(os.fdopen(r))
        pids.append(pid)
    resumed = [int(p.readline() or -1) for p in pipes]
    delay = rng.uniform(0.0, 0.25)
    victims = pids if rng.random() < 0.5 else [pids[rng.randrange(2)]]
    time.sleep(delay)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    survivors = [pid for pid in pids if pid not in victims]
    if survivors:  # killed a moment later, as torchrun's agent does once a worker died
        time.sleep(0.3)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        os.waitpid(pid, 0)
    from tgnb.train import checkpoint as ck

    dirs = ck.checkpoint_dirs(run_dir / "checkpoints")
    torn = sum(1 for d in dirs if ck.verify(d) is None)
    latest = ck.latest_complete(run_dir / "checkpoints")
    report = {"resumed": resumed, "delay": delay, "victims": len(victims), "torn": torn}
    out.write_text(json.dumps({**report, "latest": latest.step if latest else None}))


def _out_of_memory(*args: Any, **kwargs: Any) -> Any:
    raise torch.OutOfMemoryError("injected: out of pinned memory while staging")


def fault_rank(rank: int, store: str, root: Path, out: Path) -> None:
    """Four saves at step 2 that fail on one rank only, after a good save at step 1: three with a
    real error from the file system (a directory stands where that rank must write a file) --
    rank 1's RNG file in a synchronous save, then in an asynchronous one; rank 0's marker -- and
    rank 1's staging of an asynchronous save (an out-of-memory error, injected: the one fault
    faked here, as no CPU test can exhaust memory safely). Every rank must come back from the
    save (no collective left waiting), and every rank must fail alike: at once when the RNG file or
    the staging failed, at `finish` when only rank 0's marker did."""
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    state, _ = dcpio.split_state(model, opt, adapter_only=False)
    share = dcpio.own_share(state)  # what this rank writes of the replicated (DDP) state
    report: dict[str, Any] = {
        "share": sorted(
            f"{top}.{k}.{sub}"
            for top, d in share.items()
            for k, v in d.items()
            for sub in (v if isinstance(v, dict) else [""])
        ),
        "share_bytes": sum(
            t.numel() * t.element_size()
            for d in share.values()
            for v in d.values()
            for t in (v.values() if isinstance(v, dict) else [v])
        ),
    }
    for case, victim, blocker in (
        ("sync", 1, "rng-1.safetensors"),
        ("async", 1, "rng-1.safetensors"),
        ("marker", 0, "tgnb-complete.json"),  # a directory where the marker goes
        ("staging", 1, None),
    ):
        run_dir = root / case
        trainer = SimpleNamespace(
            model=model, optimizer=opt, lr_scheduler=None, state=TrainerState()
        )
        trainer.state.max_steps = 10
        policy = CheckpointPolicy(watch_drain=False, on_signal=False, allow_fresh_start=True)
        guard = CheckpointGuard(policy, run_dir, Recorder(run_dir))
        guard.attach(trainer)
        saver = guard.saver
        assert saver is not None
        meta = {"world_size": 2, "global_batch": 2, "samples": 2, "adapter_only": False}
        trainer.state.global_step = 1
        saver.save(trainer, 1, "periodic", meta, sync=True)
        if rank == victim and blocker:
            (run_dir / "checkpoints" / "checkpoint-2" / blocker).mkdir(parents=True)
        dist.barrier()
        trainer.state.global_step = 2
        copy = dcpwriter.CachedStager._stage  # the CPU copy, before the ranks agree
        if rank == victim and blocker is None:
            dcpwriter.CachedStager._stage = _out_of_memory  # type: ignore[method-assign]
        saver.save(trainer, 2, "periodic", meta, sync=case in ("sync", "marker"))
        dcpwriter.CachedStager._stage = copy  # type: ignore[method-assign]
        saver.wait()
        got: dict[str, Any] = {"after_save": str(saver.failure or "")}
        try:
            got["exit"] = guard.finish(trainer)
        except Exception as exc:
            got["finish_error"] = f"{type(exc).__name__}: {exc}"
        report[case] = got
    out.with_name(f"{out.stem}-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    mode, run_dir = sys.argv[1], Path(sys.argv[2])
    if mode == "reshard":
        world, steps, out = int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
        import torch.multiprocessing as mp

        store = tempfile.mktemp(prefix="store-", dir=run_dir.parent)
        # forked: the ranks inherit this process's imports instead of paying them again
        mp.start_processes(
            reshard, args=(world, store, run_dir, steps, out), nprocs=world, start_method="fork"
        )
    elif mode == "fault":
        import torch.multiprocessing as mp

        store = tempfile.mktemp(prefix="store-", dir=run_dir.parent)
        out = Path(sys.argv[3])
        mp.start_processes(fault_rank, args=(store, run_dir, out), nprocs=2, start_method="fork")
    else:
        for seed in map(int, sys.argv[3].split(",")):
            out = run_dir.parent / f"trial-{seed}.json"
            kill_trial(run_dir, seed, out)
            print(out.read_text(), flush=True)


if __name__ == "__main__":
    main()
