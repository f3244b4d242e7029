"""A save that fails on one rank only (2 gloo ranks, the real saver and guard, `dist_worker.py
fault`): the failure is real (a directory stands where that rank must write its RNG file, or rank
0 its marker). No rank may be left waiting in a collective (the subprocess has
a timeout), every rank must end the same way, and the last complete checkpoint must survive. One
more case injects an out-of-memory error into one rank's staging (see `dist_worker.fault_rank`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tgnb.train import checkpoint as ck

#: Every test reads the reports of ranks the module's fixture ran under torch.distributed.
pytestmark = pytest.mark.training

HERE = Path(__file__).parent


@dataclass
class Faults:
    root: Path  # the run directories, one per case
    stderr: str
    ranks: list[dict[str, Any]]  # each rank's report


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Faults:
    """One run of the 2-rank worker (all cases), shared by this module's tests."""
    tmp = tmp_path_factory.mktemp("faults")
    root, out = tmp / "runs", tmp / "report.json"
    got = subprocess.run(
        [sys.executable, str(HERE / "dist_worker.py"), "fault", str(root), str(out)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-3000:]
    ranks = [json.loads(out.with_name(f"report-{r}.json").read_text()) for r in (0, 1)]
    return Faults(root, got.stderr, ranks)


@pytest.mark.timeout(300)
def test_a_save_failing_on_one_rank_fails_on_every_rank_and_keeps_the_last_checkpoint(
    faults: Faults,
) -> None:
    root, ranks = faults.root, faults.ranks
    for case in ("sync", "async"):  # rank 1's RNG file: both ranks know at once
        for r, report in enumerate(ranks):
            assert "on rank 1: SafetensorError" in report[case]["after_save"], (case, r, report)
            assert "checkpoint failed" in report[case]["finish_error"], (case, r, report)
    # rank 1's staging (out of memory): every rank's async_save fails before DCP's collectives
    assert "injected: out of pinned memory" in ranks[1]["staging"]["after_save"]
    assert "failed on another rank" in ranks[0]["staging"]["after_save"]
    for report in ranks:
        assert "checkpoint failed" in report["staging"]["finish_error"], report
    # rank 0's marker: rank 1 learns of it at finish; both raise, so torchrun's launcher sees
    # the same failure from every worker
    assert "Is a directory" in ranks[0]["marker"]["after_save"]
    assert ranks[1]["marker"]["after_save"] == ""
    for report in ranks:
        assert "checkpoint failed" in report["marker"]["finish_error"], report
    for case in ("sync", "async", "marker", "staging"):
        ckpts = root / case / "checkpoints"
        latest = ck.latest_complete(ckpts)
        assert latest is not None and latest.step == 1, case
        assert [p.name for p in ck.checkpoint_dirs(ckpts)] == ["checkpoint-1"], case
    assert "rank 1" in faults.stderr and "the last complete checkpoint is kept" in faults.stderr


def test_the_ranks_share_out_a_replicated_state_before_staging_it(faults: Faults) -> None:
    """Under DDP every rank holds the whole state; each writes (and stages) only its share: the
    shares are disjoint, cover everything, and are balanced by size (the same worker run)."""
    ranks = faults.ranks
    shares = [set(r["share"]) for r in ranks]
    assert shares[0] and shares[1] and not shares[0] & shares[1]
    assert len(shares[0] | shares[1]) == 8  # 2 model tensors, 3 optimizer tensors for each
    # Linear(8, 8) under AdamW, 872 bytes: weight, its exp_avg and exp_avg_sq (256 B each); bias
    # and its two (32 B each); two 4 B steps. Largest first, each to the lighter rank: 512 / 360
    assert sorted(r["share_bytes"] for r in ranks) == [360, 512]
