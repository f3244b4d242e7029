"""The fast tier, ``python -m pytest -m "not training"`` (the README's Developing paragraph):
tests/conftest.py marks ``training`` every test that is ``slow``, marked so itself, or uses one of
`tests.conftest.TRAINING_FIXTURES` (the fixtures that launch runs); the others stay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fast_tier(*paths: str) -> set[str]:
    """The test ids ``-m "not training"`` selects among `paths` (collected, not run)."""
    collect = ["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not training"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *collect, *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_the_fast_tier_leaves_out_the_tests_that_start_training() -> None:
    recovery = "tests/backends/local/test_recovery.py"  # a demo cluster: the `session` fixture
    budget = "tests/train/test_budget_node.py"
    kept = fast_tier(recovery, budget, "tests/test_events.py")
    assert not [n for n in kept if n.startswith(recovery)], kept
    slow = f"{budget}::test_a_program_that_ignores_the_budgets_sigterm_is_killed_after_its_grace"
    assert slow not in kept and any(n.startswith(budget) for n in kept), kept
    assert "tests/test_events.py::test_lifecycle_record_round_trip" in kept
