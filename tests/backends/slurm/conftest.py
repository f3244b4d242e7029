"""Fixtures for the Slurm backend tests: a real one-node Slurm (slurmctld + slurmd + munged).

`slurm` makes sure a controller answers, starting it with ``.ci/slurm-up`` when it does not (and
stopping what it started at the end). Where Slurm cannot start, the tests that need it are skipped,
except under CI (``CI=true``), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SLURM_UP = REPO / ".ci" / "slurm-up"
SLURM_DOWN = REPO / ".ci" / "slurm-down"
NODE = os.environ.get("TGNB_SLURM_NODE", "localhost")


def _answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm is needed under CI but {why}", pytrace=False)
    pytest.skip(f"no Slurm here: {why}")


def node_state() -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-n", NODE, "-o", "%T"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def resume_node() -> None:
    """Bring the test node back if a test left it drained (State=RESUME)."""
    if "drain" in node_state():
        subprocess.run(
            ["scontrol", "update", f"NodeName={NODE}", "State=RESUME"], check=False, timeout=15
        )


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """The name of the node of a running one-node Slurm (partitions ``low`` and ``high``)."""
    started = False
    if not _answers():
        if shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists():
            _unavailable(
                "slurmctld is not installed (apt-get install slurmctld slurmd slurm-client munge)"
            )
        if os.geteuid() != 0:
            _unavailable("starting slurmctld/slurmd needs root")
        proc = subprocess.run(
            ["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            _unavailable(f".ci/slurm-up failed: {proc.stderr.strip()[-300:]}")
        started = True
    resume_node()
    yield NODE
    resume_node()
    if started:
        subprocess.run(["bash", str(SLURM_DOWN)], check=False, timeout=60)


@pytest.fixture
def cleanup_jobs() -> Iterator[list[str]]:
    """Job ids to cancel after the test, whatever happened."""
    jobs: list[str] = []
    yield jobs
    for job in jobs:
        subprocess.run(["scancel", job], check=False, timeout=30)
    resume_node()
