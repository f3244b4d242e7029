"""Money and time from what the engine ran (`tgnb.runs.meter`), for every program, on the local
engine: a real emulator over HTTP, the real supervisor, real processes.

Two programs from folders of their own, as a user writes them: one that never imports tgnb (a
plain loop that prints its steps), and its twin with the `tgnb.train.Checkpointer` as
docs/own-code.md writes it. With a budget each is stopped at the budget, reads "cancelled: budget
reached at $X of $Y" with exit 77, and no preemption; without one, a preemption of the plain
program is counted from the engine's notice, its steps are unknown (None), and the node-time it
redid is counted. The dollars are compared with the engine's own placed and released times.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.events import JOB_PLACED, JOB_RELEASED, RUN_EXITED, SIGNAL_SENT
from tgnb.runs import meter
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState
from tgnb.server.serialize import run_json
from tgnb.session import Session

PLAIN = """\
    import sys, time

    steps = int(sys.argv[1])
    for step in range(1, steps + 1):
        time.sleep(0.05)
        print(f"step {step} {time.time():.3f}", flush=True)
    print("done", flush=True)
"""

PROTECTED = """\
    import sys, time

    import torch
    from tgnb.train import Checkpointer

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = Checkpointer(model, opt, max_steps=int(sys.argv[1]), dir="out")
    for step in ckpt.steps():
        time.sleep(0.05)
        loss = model(torch.ones(4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ckpt.log(loss=loss)
        print(f"step {step}", flush=True)
    print("done", flush=True)
"""


def _workdir(tmp_path: Path, name: str, text: str) -> Path:
    wd = tmp_path / f"wd-{name}"
    wd.mkdir()
    (wd / "train.py").write_text(textwrap.dedent(text))
    return wd


def _printed_steps(run: Run) -> list[int]:
    return [int(line.split()[1]) for line in run.logs() if line.startswith("step ")]


def _printed_times(run: Run) -> list[float]:
    return [float(line.split()[2]) for line in run.logs() if line.startswith("step ")]


def _engine_dollars(run: Run) -> float:
    """The run's dollars from the engine's own events, priced here (not through `run_cost`)."""
    prices = run.prices()
    assert prices is not None
    total = 0.0
    for s in meter.stretches(run.run_events()):
        assert s.cause != "open", s
        total += s.gpu_hours * prices.of(s.node_class)
    return total


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("program", ["plain", "protected"])
def test_budget_stops_every_program_and_reads_as_a_budget_stop(
    session: Session, tmp_path: Path, program: str
) -> None:
    prices = session.prices()
    assert prices is not None
    gpus = 8
    # 25 s of the node from its placement: torch's import (seconds, on a loaded machine) and steps
    budget = round(prices.preemptible * gpus * 25.0 / 3600, 6)
    wd = _workdir(tmp_path, program, PLAIN if program == "plain" else PROTECTED)
    run = session.launch(
        "train.py", args=["2000"], workdir=wd, name=f"budget-{program}",
        gpus_per_node=gpus, budget_usd=budget,
    )  # fmt: skip
    status = run.wait(timeout=300, progress=False)
    assert status.state == JobState.CANCELLED, status
    assert status.detail.startswith("budget reached at $"), status
    assert status.exit_code == 77, status
    printed = _printed_steps(run)
    assert printed and max(printed) < 2000, printed[-3:]  # stopped, not run to its end

    summary = run.summary()
    assert summary["preemptions"] == 0, summary
    assert summary["gpu_hours"] > 0 and summary["cost_usd"] >= budget, summary
    assert summary["cost_usd"] == pytest.approx(_engine_dollars(run), rel=0.02), summary
    shown = run_json(run)  # what the sidebar shows: unknown steps, never 0
    assert shown["step"] == summary["steps"] and shown["cost_usd"] == summary["cost_usd"], shown
    assert summary["protected"] is (program == "protected"), summary
    assert (run.cost().lost_steps is None) is (program == "plain")  # %tg cost: "unknown"
    if program == "plain":
        assert summary["steps"] is None and summary["steps_lost"] is None, summary
        assert summary["note"] and summary["note"].startswith("unprotected"), summary
        # what it was billed for against what it ran, by its own clock: the node's stretch holds
        # every line it printed, and lies inside the run's life (from its submission to its
        # cancelled state). How much longer than the printing it is depends on the machine's load
        # (the process's start and stop): no wall-clock bound is asserted.
        (held,) = meter.stretches(run.run_events())
        times = _printed_times(run)
        assert held.start <= times[0] and times[-1] <= held.end, (held, times[0], times[-1])
        changes = run.history()
        assert changes[0].time <= held.start and held.end <= changes[-1].time + 1e-3, (
            held,
            changes,
        )
    else:
        assert summary["steps"] == max(printed), (summary, printed[-3:])

    evs = run.run_events()
    placed = [e for e in evs if e.reason == JOB_PLACED]
    released = [e for e in evs if e.reason == JOB_RELEASED]
    assert len(placed) == len(released) == 1, (placed, released)
    assert released[0].data["cause"] == "budget", released[0]
    sent = [e for e in evs if e.reason == SIGNAL_SENT]
    assert sent and all("budget reached" in e.message for e in sent), sent
    exits = [e for e in evs if e.reason == RUN_EXITED]
    assert all("preempted" not in e.message for e in exits), exits


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_preempted_program_with_no_hook_is_metered_and_counted(
    session: Session, tmp_path: Path
) -> None:
    wd = _workdir(tmp_path, "plain-preempted", PLAIN)
    run = session.launch("train.py", args=["120"], workdir=wd, name="plain-preempted")
    wait_until(lambda: len(_printed_steps(run)) >= 20 and run.status.nodes, timeout=240)
    session.preempt(run.status.nodes[0])
    status = run.wait(timeout=400, progress=False)
    assert status.state == JobState.SUCCEEDED, status
    summary = run.summary()
    assert summary["preemptions"] == 1, summary
    assert summary["steps"] is None and summary["steps_lost"] is None, summary
    assert summary["gpu_hours"] > 0 and summary["lost_gpu_hours"] > 0, summary
    # the node-time it redid: the whole first attempt (it saves nothing), from placed to released
    first = [s for s in meter.stretches(run.run_events()) if s.attempt == 0]
    assert summary["lost_node_seconds"] == pytest.approx(first[0].end - first[0].start, abs=0.1)
    assert summary["cost_usd"] == pytest.approx(_engine_dollars(run), rel=0.02), summary
    causes = [e.data["cause"] for e in run.run_events() if e.reason == JOB_RELEASED]
    assert causes == ["preempted", "done"], causes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_programs_own_exit_77_is_a_failure_not_a_budget_stop(
    session: Session, tmp_path: Path
) -> None:
    """Exit 77 is the budget's only when tgnb stopped the run at its budget: a program that
    exits 77 on its own, with no budget, fails with its code, not restarted, never "budget"."""
    wd = _workdir(tmp_path, "own-77", PLAIN.replace('print("done", flush=True)', "sys.exit(77)"))
    # a command keeps its own exit code (torchrun, which runs a script, would make it 1)
    run = session.launch(command=["python", "train.py", "3"], workdir=wd, name="own-77")
    status = run.wait(timeout=200, progress=False)
    assert (status.state, status.exit_code) == (JobState.FAILED, 77), status
    assert "budget" not in status.detail, status
    causes = [e.data["cause"] for e in run.run_events() if e.reason == JOB_RELEASED]
    assert causes == ["failed"], causes
