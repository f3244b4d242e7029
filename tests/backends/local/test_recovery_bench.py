"""`bench/recovery.py --engine emulator` runs: on a tiny trace, the plain ``--requeue`` baseline,
the deadline policy and all-standard as real local-engine runs of the stand-in on a real emulator
daemon, and the table of ratios printed. The figures are the bench's: only the table's shape and
the node classes of the placements are checked here, never a timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "recovery.py"


@pytest.mark.slow
def test_the_emulator_mode_runs_the_policies_and_prints_the_ratios(tmp_path: Path) -> None:
    policies = "plain --requeue,deadline,all-standard"
    cmd = [sys.executable, str(BENCH), "--engine", "emulator", "--steps", "30", "--step-s",
           "0.05", "--between-min", "20", "--outage-min", "3", "--policies", policies]  # fmt: skip
    env = {**os.environ, "TGNB_HOME": str(tmp_path)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=170, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {
        line.split("  ")[0].strip(): line.split()
        for line in out.stdout.splitlines()
        if line.startswith(tuple(n.ljust(16) for n in policies.split(",")))
    }
    assert set(rows) == {"plain --requeue", "deadline", "all-standard"}, out.stdout
    plain = rows["plain --requeue"]
    assert plain[4:6] == ["1.00", "1.00"]  # the baseline's own ratios
    assert set("".join(plain[7:])) == {"P"}  # the plain script stays on preemptible nodes
    assert rows["all-standard"][5:7] == ["0", "SS"]  # two standard nodes, never restarted
    assert "met:" in rows["deadline"]
    assert "deadline cost / all-standard cost:" in out.stdout
    assert "trace (platform min" in out.stdout
