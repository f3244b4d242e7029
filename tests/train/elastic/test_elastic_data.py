"""A resume at another world size mid-epoch continues from the sample position: every sample of
each epoch is trained once through a shrink 2 -> 1 and a grow 1 -> 2, each mid-epoch, counted from
the programs' own logs (each rank prints the ids it trains). Before, the resume skipped the saved
number of *batches*, which at another world size covers other samples: some were trained twice,
others never (issue 48). The global batch's change is stated in a line.

Two programs, run by torchrun (``python -m tgnb.train.launch``, gloo on the CPU) at 2, 1 and 2
processes over one run directory: a Lightning DDP script under ``tgnb.train.protect`` as
Lightning's docs write it (``strategy="ddp"``, ``use_distributed_sampler=True``), and a plain loop
under the ``Checkpointer`` with ``tgnb.train.ElasticSampler`` added by ``add_state``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SAMPLES = 64  # per epoch; batch 4 per rank
RESIZED = "the epoch continues from its sample position"


def _run(wd: Path, procs: int, script: str, *args: str, code: int) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env.update(TGNB_HOME=str(wd / "home"), OMP_NUM_THREADS="1")
    launch = [sys.executable, "-m", "tgnb.train.launch", "--standalone"]
    cmd = [*launch, f"--nproc_per_node={procs}", script, *args]
    done = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == code, out[-3000:]
    return out


def _per_epoch(logs: list[str]) -> dict[int, Counter[int]]:
    seen: dict[int, Counter[int]] = {}
    for log in logs:
        for epoch, _rank, ids in re.findall(r"^ids (\d+) (\d+) ([\d,]+)$", log, re.M):
            seen.setdefault(int(epoch), Counter()).update(int(i) for i in ids.split(","))
    return seen


def _shrink_and_grow(tmp_path: Path, script: str, first: str, second: str) -> list[str]:
    wd = tmp_path / "wd"
    shutil.copytree(HERE, wd, ignore=shutil.ignore_patterns("__pycache__", "test_*"))
    logs = [_run(wd, 2, script, "--sigterm-at", first, code=75)]  # stopped mid-epoch 1
    logs.append(_run(wd, 1, script, "--sigterm-at", second, code=75))  # shrunk, mid-epoch 2
    logs.append(_run(wd, 2, script, code=0))  # grown back
    return logs


def _each_once(seen: dict[int, Counter[int]], whole: int) -> None:
    """Each epoch trained no sample twice; the first `whole` epochs trained every sample."""
    assert sorted(seen) == list(range(len(seen))) and len(seen) >= whole, sorted(seen)
    for epoch, count in seen.items():
        twice = sorted(i for i, n in count.items() if n > 1)
        assert not twice, f"epoch {epoch}: trained twice {twice}"
        if epoch < whole:
            assert sorted(count) == list(range(SAMPLES)), f"epoch {epoch}: {len(count)} samples"


@pytest.mark.slow
def test_lightning_resumed_at_another_world_size_trains_each_sample_once(tmp_path: Path) -> None:
    # at 2 ranks an epoch is 8 steps, at 1 rank 16: step 12 is the 4th batch of epoch 1 (32
    # samples trained); at 1 rank epoch 1 ends at step 20, step 27 is epoch 2's 7th (28 samples,
    # not a whole batch of 2 ranks: the grown run's batch counter rounds down, its data does not)
    logs = _shrink_and_grow(tmp_path, "lit_ids.py", "11", "26")
    seen = _per_epoch(logs)
    assert len(seen) == 3
    _each_once(seen, 3)
    assert "resumed at world size 1 (saved at 2): the global batch is now 4" in logs[1], logs[1]
    assert "resumed at world size 2 (saved at 1): the global batch is now 8" in logs[2], logs[2]
    assert RESIZED in logs[1] and RESIZED in logs[2]


@pytest.mark.slow
def test_a_checkpointer_loop_resumed_at_another_world_size_trains_each_sample_once(
    tmp_path: Path,
) -> None:
    # 2 ranks: 8 steps an epoch, 1 rank: 16. Step 12: epoch 1's 4th batch (32 samples); at 1 rank
    # epoch 1 ends at step 20, step 26 is epoch 2's 6th batch (24 samples); grown back, epoch 2
    # ends at step 31, epoch 3 at step 39, and step 40 begins epoch 4
    logs = _shrink_and_grow(tmp_path, "loop_ids.py", "12", "26")
    assert "resumed at world size 1 (saved at 2): the global batch is now 4" in logs[1], logs[1]
    assert "resumed at world size 2 (saved at 1): the global batch is now 8" in logs[2], logs[2]
    seen = _per_epoch(logs)
    assert len(seen) == 5
    _each_once(seen, 4)
