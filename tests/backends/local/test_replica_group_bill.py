"""What tgnb says a fault-tolerant run (issue 50) cost, against the emulator's own record of the
nodes it ran on, for a plain TorchFT program that never imports tgnb
(`tests/backends/ft_workdir/train_ft.py`), on the local engine with real processes.

The emulator bills a node from its ``ready_at`` to its ``removed_at`` (its node view, the platform's
``node_lifecycle_events``), for every GPU of it, whatever runs there; tgnb counts what the run held
(each group's node from its ``JobPlaced`` to its ``JobReleased``). So tgnb's figure is bounded on
both sides by records that are not its own:

- above, by the emulator's bill of those nodes over the run's window (first placement to last
  release): tgnb never shows more than the platform bills. The tolerance is the engine's polling:
  the groups' loop reads the fleet at most once a second (`REFRESH_S`) and sees a process's end
  at its next poll (`POLL_S`, the supervisor's 0.2 s), so a group's release is recorded at most
  `TOLERANCE_S` after the node's removal that ended it, and each held node may be priced that much
  past the bill;
- below, by what the program ran by its own clock: every line each group printed (its start to its
  last step) lies inside a stretch of that group on the node it joined on, the replacement's
  included, so a group not counted, or a replacement missed, falls below it.

tgnb's dollars are also the engine's events priced here directly (no `run_cost`), up to the
summary's rounding to 1e-4 $. Counted twice, a group would exceed the bill.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import BUDGET_REACHED, GROUP_JOINED, GROUP_LEFT, JOB_RELEASED
from tgnb.runs import meter
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.session import Session

from .test_replica_groups import FT_WORKDIR, of, steps

pytest.importorskip("torchft")

POLL_S = 0.2  # the supervisor's poll (`tgnb.backends.local.supervisor`, its default)
REFRESH_S = 1.0  # the groups' loop reads the fleet (and prices the budget) at most once a second
TOLERANCE_S = REFRESH_S + 2 * POLL_S


def bill(run: Run, emu: EmulatorHandle, cluster_id: str) -> dict[str, Any]:
    """tgnb's figure, the emulator's bill and the program's own span for `run`, finished; asserts
    each held stretch lies inside its node's life on the emulator, and each group's printed lines
    inside a stretch of that group on its node."""
    prices = run.prices()
    assert prices is not None
    held = meter.stretches(run.run_events())
    assert held and all(s.cause != "open" and s.group is not None for s in held), held
    nodes = {n.name: n for n in emu.node_infos(cluster_id)}
    start, end = min(s.start for s in held), max(s.end for s in held)
    billed = exact = 0.0
    for name in {s.node for s in held}:
        n = nodes[name]
        assert n.ready_at is not None, n
        mine = [s for s in held if s.node == name]
        gone = n.removed_at if n.removed_at is not None else float("inf")
        for s in mine:  # held only while the node was up (RFC 3339 keeps microseconds)
            assert n.ready_at - 1e-3 <= s.start and s.end <= gone + TOLERANCE_S, (n, s)
        life = max(min(gone, end) - max(n.ready_at, start), 0.0)
        exact += life * mine[0].gpus / 3600 * prices.of(n.kind)
        billed += (life + TOLERANCE_S) * mine[0].gpus / 3600 * prices.of(n.kind)
    ours = sum(s.gpu_hours * prices.of(s.node_class) for s in held)
    # what ran, by the program's own clock: each incarnation of a group from its start line to
    # its last line, inside a stretch of that group on the node it joined on
    joined = [(e["data"]["group"], e["node"]) for e in of(run, GROUP_JOINED)]
    lines = steps(run)
    ran = 0.0
    for group in {g for g, _ in joined}:
        mine = [s for s in lines if s.get("group") == group]
        starts = [i for i, s in enumerate(mine) if "started" in s]
        for k, i in enumerate(starts):
            part = mine[i : starts[k + 1] if k + 1 < len(starts) else len(mine)]
            first, last = part[0]["started"], max(s.get("t", part[0]["started"]) for s in part)
            where = [s for s in held if s.group == group and s.start <= first and last <= s.end]
            assert len(where) == 1, (group, first, last, held)
            assert (group, where[0].node) in joined, (group, where[0], joined)
            ran += (last - first) * where[0].gpus / 3600 * prices.of(where[0].node_class)
    summary = run.summary()
    out = {"tgnb": summary["cost_usd"], "engine": ours, "bill": exact, "bill+tolerance": billed,
           "ran": ran, "held": held}  # fmt: skip
    print(f"{run.name}: " + ", ".join(f"{k} ${v:.4f}" for k, v in out.items() if k != "held"))
    assert summary["cost_usd"] == pytest.approx(ours, abs=1e-4), out
    assert summary["gpu_hours"] == pytest.approx(sum(s.gpu_hours for s in held), abs=1e-4)
    assert ran <= ours <= billed, out
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_uninterrupted_runs_cost_is_within_the_bill_and_holds_what_ran(
    session: Session, emu: EmulatorHandle
) -> None:
    run = session.launch("train_ft.py", workdir=FT_WORKDIR, name="ft-bill", nodes=2,
                         env={"FT_STEPS": "200", "FT_STEP_S": "0.05"},
                         fault_tolerance="torchft")  # fmt: skip
    final = run.wait(timeout=400, progress=False)
    assert final.state == JobState.SUCCEEDED, (final, run.logs()[-40:])
    figures = bill(run, emu, session.cluster.id)
    assert sorted(s.group for s in figures["held"]) == [0, 1]  # the lighthouse holds no node
    summary = run.summary()
    assert summary["preemptions"] == 0 and summary["lost_node_seconds"] == 0, summary
    assert summary["groups"][0].startswith("groups: 2 at the start"), summary["groups"]
    assert "0 left before the end" in summary["groups"][0], summary["groups"]
    assert summary["groups"][0] in run.closing_line()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_budget_stops_every_group_as_a_budget_stop(session: Session, emu: EmulatorHandle) -> None:
    prices = session.prices()
    assert prices is not None
    # 30 s of both groups' nodes (8 GPUs each) from their placement: torch's import, then steps
    budget = round(prices.preemptible * 16 * 30.0 / 3600, 6)
    run = session.launch("train_ft.py", workdir=FT_WORKDIR, name="ft-budget", nodes=2,
                         env={"FT_STEPS": "100000", "FT_STEP_S": "0.05"}, budget_usd=budget,
                         fault_tolerance="torchft",
                         recovery=RecoveryPolicy(max_restarts=2))  # fmt: skip
    wait_until(lambda: run.status.state.finished, 400, what="the budget's stop")
    final = run.wait(timeout=60, progress=False)
    assert final.state == JobState.CANCELLED, final
    assert final.detail.startswith("budget reached at $"), final
    assert final.exit_code == 77, final
    causes = sorted(e["data"]["cause"] for e in of(run, GROUP_LEFT))
    assert causes == ["budget", "budget"], of(run, GROUP_LEFT)
    released = sorted(e["data"]["cause"] for e in of(run, JOB_RELEASED))
    assert released == ["budget", "budget"], released
    assert len(of(run, BUDGET_REACHED)) == 1
    assert len(of(run, GROUP_JOINED)) == 2  # no replacement after the stop
    figures = bill(run, emu, session.cluster.id)
    summary = run.summary()
    assert summary["preemptions"] == 0, summary
    assert summary["cost_usd"] >= budget, (summary, budget)
    print(f"ft-budget: budget ${budget:.4f}, stopped at ${summary['cost_usd']:.4f}")
    assert figures["tgnb"] == summary["cost_usd"]
    lines = summary["groups"]
    assert len(lines) == 3 and all(line.endswith(": stopped at the budget") for line in lines[1:])
