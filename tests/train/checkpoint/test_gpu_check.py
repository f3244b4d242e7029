"""``bench/gpu_check.sh``, the one script a session runs on a borrowed H200, end to end at the tiny
CPU scale of its knobs, so that a bug in it does not cost scarce GPU time.

What is faked: the device is the CPU (``GPU_CHECK_DEVICE=cpu``: section 1 benches a 1M-parameter
state in CPU memory, sections 2 and 3 train with ``trl.use_cpu=true``), section 2's Llama is tiny
(hidden 64, 2 layers) instead of ~1B, and section 3 runs 100 steps instead of 300. On the CPU
accelerate ignores ``trl.fsdp=true`` (it runs DDP under torchrun), so section 3 checks the
script's launch, SIGTERM-to-rank-0 and resume logic and tgnb's resume, not FSDP2 itself. Everything
else is real: the same script, ``bench/checkpoint.py``, ``python -m tgnb.train`` with bf16, periodic
async saves and a SIGTERM, and ``python -m tgnb.train.launch``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_runs_end_to_end_at_cpu_scale(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPU_CHECK_DEVICE": "cpu",
        "GPU_CHECK_PARAMS": "1e6",
        "GPU_CHECK_SHAPE": "64,128,2",
        "GPU_CHECK_FSDP_STEPS": "100",
        "GPU_CHECK_DIR": str(tmp_path / "scratch"),
        "TGNB_HOME": str(tmp_path / "home"),
        "OMP_NUM_THREADS": "1",
    }
    (tmp_path / "scratch").mkdir()
    got = subprocess.run(
        ["bash", "bench/gpu_check.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = got.stdout
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    # section 1: the bench's row for 1M parameters on one rank, no failure
    assert re.search(r"^\s+1\.0M x1 .* \(a\) .* \(b\) .* \(c\) ", out, re.M), out
    assert "section 1 failed" not in out
    # section 2: periodic and signal CheckpointSaved lines, exit 75
    saved = re.findall(r"^step +(\d+) (periodic|signal) +stall", out, re.M)
    assert any(t == "periodic" for _, t in saved) and any(t == "signal" for _, t in saved), out
    assert "exit code 75 " in out, out
    # section 3: SIGTERM to rank 0, exit 75, the resume finishes (exit 0), each step logged once
    assert re.search(r"^SIGTERM to rank 0 \(pid \d+\) after 4 steps$", out, re.M), out
    assert "preempted: exit 75 (75 expected); resumed: exit 0 (0 expected)" in out, out
    resumed = r"^\[\{'checkpoint': .*checkpoint-\d+', .*'step': \d+"  # the RunResumed event
    assert re.search(resumed, out, re.M), out
    assert "every step logged once: True 100 rows" in out, out
