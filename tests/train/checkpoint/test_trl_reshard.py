"""Resume at another world size through TRL, end to end: tiny DPO through the real
``python -m tgnb.train`` under ``python -m tgnb.train.launch`` (gloo, DDP), started at 2 ranks,
preempted (SIGTERM to rank 0, exit 75), resumed at 1 rank, preempted, resumed at 2 ranks, finished
at max_steps; compared with an uninterrupted 2-rank run.

What holds: every step is logged once; each ``RunResumed`` names the new and the saved world size
and the data position in global samples (step x 16); the global batch stays 16 (8 per device x 2
ranks, then 8 x 1 rank x 2 accumulated micro-batches: the checkpoint the 1-rank phase writes records
the batch its Trainer actually used); the same samples form each global batch at either size
(accelerate shards each global batch of the seeded sampler across ranks, in order).

What is not kept exactly, in general: at 1 rank the halves of a global batch are summed by gradient
accumulation (each half's loss scaled by 1/2), at 2 ranks by DDP's all-reduce (each gradient
averaged over the ranks), so the summation order differs. With two halves the results are
nevertheless identical: a scale by 1/2 is exact in floating point and a + b = b + a, so a*0.5 +
b*0.5 == (a + b)*0.5 bit for bit (measured: loss and final weights differ by 0.0 on the CPU, about
50 s). With more than two parts (4 ranks against 1, say) the grouping of the sum differs and only a
tolerance would hold. The tolerance asserted (1e-6) leaves room for kernels that are not bitwise
reproducible, nothing more.

The same with FSDP2 through the Trainer (``trl.fsdp=true``, ``fsdp_config={version: 2}``): the DCP
state at 2 ranks then holds sharded tensors, resharded to 1 rank and back. accelerate 1.15 keeps its
FSDP plugin only for GPU-like process groups: on the CPU (``MULTI_CPU``, gloo) it drops it without a
word and the run is DDP. That case is seen (the 2-rank checkpoint holds no sharded tensor) and
skipped, saying so; with accelerate's check widened to ``MULTI_CPU`` (an experiment, not shipped)
it passed, losses and weights equal to the uninterrupted FSDP run. bench/gpu_check.sh runs FSDP2
through the Trainer on a GPU."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import EXIT_PREEMPTED

from .conftest import torchrun, worker_pids

STEPS = 14
GLOBAL_BATCH = 16  # TINY_TUNING.trl["dpo"]["per_device_train_batch_size"] x 2 ranks
LOSS_TOL = 1e-6
WEIGHT_TOL = 1e-6


def losses(launcher: Any, run_dir: Path) -> dict[int, float]:
    rows = launcher.read_jsonl(run_dir / "metrics.jsonl")
    return {int(m["step"]): float(m["loss"]) for m in rows if "loss" in m}


def preempt(run: Any, ranks: int, after: int) -> int:
    """Wait for step `after`, SIGTERM rank 0's worker, expect exit 75; the step it stopped at."""
    run.wait_step(after, timeout=400)
    pids = wait_until(lambda: len(p := worker_pids(run.proc.pid)) >= ranks and p, 60)
    assert sorted(pids) == list(range(ranks)), pids
    os.kill(pids[0], signal.SIGTERM)
    assert run.wait(300) == EXIT_PREEMPTED, run.tail()
    found = re.findall(r"tgnb: rank (\d) preempted at step (\d+)", run.tail(200_000))
    stopped = {int(r): int(s) for r, s in found}
    assert sorted(stopped) == list(range(ranks)) and len(set(stopped.values())) == 1, found
    return stopped[0]


def sharded(checkpoint: Path) -> int:
    """How many tensors of `checkpoint`'s DCP state are stored in more than one chunk."""
    from tgnb.train import dcpio

    md = dcpio.SafeReader(str(checkpoint / dcpio.STATE_DIR)).read_metadata()
    return sum(len(getattr(v, "chunks", ())) > 1 for v in md.state_dict_metadata.values())


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_dpo_resumed_at_1_rank_then_2_keeps_batch_data_and_loss(
    launcher: Any, tmp_path: Path, mode: str
) -> None:
    from tgnb.tasks import assets
    from tgnb.train import checkpoint as ck

    assets.tiny_path(3, tmp_path / "home" / "assets")  # once, before two ranks could race for it
    common = ("algorithm=dpo", "model=tiny", "seed=3", "checkpoint.watch_drain=false")
    common += ("checkpoint.every_steps=5", "checkpoint.keep_last=10", f"max_steps={STEPS}")
    # 16 global batches: the 14 steps in one epoch, each rank tokenizing 256 rows, not 2000
    common += ("dataset_size=256",)
    if mode == "fsdp":
        common += ("trl.fsdp=true", "trl.fsdp_config={version: 2}")
    run_dir = tmp_path / "reshard"
    # the uninterrupted reference trains meanwhile (as in test_torchrun): its own directory and
    # rendezvous port, the same pre-built model
    reference = launcher.start(tmp_path / "reference", *common, argv=torchrun(2))

    first = launcher.start(run_dir, *common, argv=torchrun(2))
    stop1 = preempt(first, 2, 2)
    if mode == "fsdp" and not sharded(run_dir / "checkpoints" / f"checkpoint-{stop1}"):
        import accelerate

        pytest.skip(f"accelerate {accelerate.__version__} drops FSDP on the CPU: the run was DDP")
    second = launcher.start(run_dir, *common, argv=torchrun(1))
    stop2 = preempt(second, 1, stop1 + 2)
    assert stop1 < stop2 < STEPS
    done = launcher.start(run_dir, *common, argv=torchrun(2))
    assert done.wait(600) == 0, done.tail()
    assert reference.wait(600) == 0, reference.tail()

    logged = sorted(int(m["step"]) for m in launcher.read_jsonl(run_dir / "metrics.jsonl"))
    assert logged == list(range(1, STEPS + 1)), f"stops at {stop1}, {stop2}: {logged}"

    resumed = [e["data"] for e in done.events("RunResumed")]
    got = [(r["step"], r["world_size"], r["saved_world_size"], r["samples"]) for r in resumed]
    assert got == [
        (stop1, 1, 2, stop1 * GLOBAL_BATCH),
        (stop2, 2, 1, stop2 * GLOBAL_BATCH),
    ], got

    # each marker: the world size and the batch its Trainer really used (the global batch is
    # computed from the Trainer's arguments: 8 here would mean no accumulation at 1 rank)
    saved = {e["data"]["step"]: e["data"]["world_size"] for e in done.events("CheckpointSaved")}
    assert saved[stop1] == 2 and saved[stop2] == 1 and saved[STEPS] == 2, saved
    for path in ck.checkpoint_dirs(run_dir / "checkpoints"):
        marker = ck.read_marker(path)
        assert marker is not None
        assert marker.meta["global_batch"] == GLOBAL_BATCH, (path.name, marker.meta)
        assert marker.meta["samples"] == marker.step * GLOBAL_BATCH, (path.name, marker.meta)
        assert marker.meta["world_size"] == saved[marker.step]

    mine, ref = losses(launcher, run_dir), losses(launcher, tmp_path / "reference")
    assert sorted(mine) == sorted(ref) == list(range(1, STEPS + 1))
    gaps = {s: abs(mine[s] - ref[s]) for s in mine}
    print(f"stops {stop1}, {stop2}; loss gaps {gaps}")
    # the loss right after each resume continues the uninterrupted curve, and so does every other
    assert max(gaps.values()) <= LOSS_TOL, gaps
    a = launcher.weights(tmp_path / "reference" / "checkpoints" / f"checkpoint-{STEPS}")
    b = launcher.weights(run_dir / "checkpoints" / f"checkpoint-{STEPS}")
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    print(f"max abs weight difference {diff}")
    assert diff <= WEIGHT_TOL, f"max abs weight difference {diff} after stops at {stop1}, {stop2}"
    if mode == "fsdp":  # sharded at 2 ranks, whole at 1
        assert sharded(run_dir / "checkpoints" / f"checkpoint-{STEPS}")
        assert not sharded(run_dir / "checkpoints" / f"checkpoint-{stop2}")
