"""SIGKILL at seeded random instants while 2 ranks (gloo, forked from `dist_worker.py`, which
imported torch once) save DCP checkpoints step after step, alternately asynchronous and
synchronous, through the real saver; one rank or both are killed (the other then, as torchrun's
agent would). Each trial resumes through the real `CheckpointGuard.resume_from` (torn ones are
reported and moved aside) and checks that every tensor it loaded holds exactly the step it resumed
from: a complete checkpoint, never a torn or mixed one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
TRIALS = 30


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_of_one_rank_or_all_during_saves_never_yields_a_torn_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    seeds = ",".join(str(7000 + i) for i in range(TRIALS))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    got = subprocess.run(
        [sys.executable, str(HERE / "dist_worker.py"), "kill", str(run_dir), seeds],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    trials = [json.loads(line) for line in got.stdout.splitlines() if line.startswith('{"resumed')]
    assert len(trials) == TRIALS, got.stdout[-2000:]
    assert not list(run_dir.glob("torn-resume-*")), [p.read_text() for p in run_dir.glob("torn-*")]
    previous = None
    for i, t in enumerate(trials):
        assert t["resumed"][0] == t["resumed"][1], (i, t)  # every rank resumed from the same step
        if i:
            # exactly the newest checkpoint found complete after the previous kill (or 0: none)
            assert t["resumed"][0] == (previous or 0), (i, t, previous)
        previous = t["latest"]
    torn = sum(1 for t in trials if t["torn"])
    both = sum(1 for t in trials if t["victims"] == 2)
    print(f"{torn} of {TRIALS} kills left a torn checkpoint; {both} killed both ranks")
    assert torn >= TRIALS // 4, "the kills did not land inside saves"
    assert 0 < both < TRIALS
    assert trials[-1]["latest"] is not None and trials[-1]["latest"] > 5
