"""`bench/goodput.py --gpu-regime`: the simulation takes the runtime's own interval and behaves as
its model says (pure arithmetic, no training; the figures it prints are the bench's, not asserted
here beyond their order)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from tgnb.runs.policy import CheckpointPolicy
from tgnb.train.checkpoint import young_daly_seconds

BENCH = Path(__file__).resolve().parents[3] / "bench" / "goodput.py"


@pytest.fixture(scope="module")
def goodput() -> Any:
    spec = importlib.util.spec_from_file_location("goodput_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def args(goodput: Any) -> Any:
    return goodput.parser().parse_args(["--gpu-regime", "--cycles", "4000"])


def test_tgnb_takes_the_runtimes_interval(goodput: Any) -> None:
    a = args(goodput)
    res = goodput.simulate(a)
    stall = 90.0 * 6.3 / 148.8
    policy = CheckpointPolicy()
    assert a.failures_per_hour == policy.failures_per_hour
    want = young_daly_seconds(stall, policy.failures_per_hour, 90.0, 1.0)
    assert res["interval_tgnb_s"] == pytest.approx(want)
    assert res["interval_baseline_s"] == pytest.approx(young_daly_seconds(90.0, 1.0))
    # every interruption has a notice: stopping there, with free periodic saves, is the ceiling
    assert res["baseline"] < res["tgnb"] < res["bound_over_baseline"] * res["baseline"]


def test_insurance_pays_only_when_interruptions_come_without_a_notice(goodput: Any) -> None:
    a = args(goodput)
    rare, often = 0.01, 1.0  # failures/h assumed by auto
    calm = [goodput.simulate(a, f, 0.0)["tgnb"] for f in (rare, often)]
    hard = [goodput.simulate(a, f, 1.0)["tgnb"] for f in (rare, often)]
    assert calm[0] > calm[1]  # all with a notice: fewer periodic saves are better
    assert hard[0] < hard[1]  # none with a notice: the periodic saves are what is kept
    # the baseline ignores notices; with none at all it stays below tgnb (smaller stalls)
    assert goodput.simulate(a, often, 1.0)["tgnb_over_baseline"] > 1.0
