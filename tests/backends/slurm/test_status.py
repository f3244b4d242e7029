"""Parsing ``scontrol show job -o`` records (as printed by Slurm 22.05 here) into `JobStatus`."""

from __future__ import annotations

import pytest

from tgnb.backends.base import JobState
from tgnb.backends.slurm import job_status, parse_fields
from tgnb.events import BUDGET_REACHED, Event, utcnow
from tgnb.runs import budget
from tgnb.runs.node import Exit

RUNNING = (
    "JobId=3 JobName=t.sh UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=1 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 NodeList=localhost BatchHost=localhost "
    "Features=preemptible Command=/tmp/my dir/t.sh WorkDir=/tmp/sx StdOut=/tmp/sx/t-3.out Power= "
)


def test_parse_fields_keeps_values_with_spaces() -> None:
    f = parse_fields(RUNNING)
    assert f["JobState"] == "RUNNING"
    assert f["Command"] == "/tmp/my dir/t.sh"
    assert f["WorkDir"] == "/tmp/sx"
    assert f["Power"] == ""


@pytest.mark.parametrize(
    ("state", "reason", "restarts", "exit_code", "want"),
    [
        ("PENDING", "Priority", "0", "0:0", JobState.PENDING),
        ("PENDING", "BeginTime", "1", "0:0", JobState.REQUEUED),
        ("REQUEUED", "None", "1", "0:0", JobState.REQUEUED),
        ("PREEMPTED", "None", "0", "0:15", JobState.REQUEUED),
        ("RUNNING", "None", "2", "0:0", JobState.RUNNING),
        ("COMPLETING", "None", "0", "0:0", JobState.RUNNING),
        ("COMPLETED", "None", "1", "0:0", JobState.SUCCEEDED),
        ("FAILED", "NonZeroExitCode", "0", "3:0", JobState.FAILED),
        ("TIMEOUT", "TimeLimit", "0", "0:15", JobState.FAILED),
        ("CANCELLED", "None", "0", "0:15", JobState.CANCELLED),
        ("WHATEVER", "None", "0", "0:0", JobState.UNKNOWN),
    ],
)
def test_state_mapping(
    state: str, reason: str, restarts: str, exit_code: str, want: JobState
) -> None:
    line = RUNNING.replace("JobState=RUNNING Reason=None", f"JobState={state} Reason={reason}")
    line = line.replace("Restarts=1", f"Restarts={restarts}").replace(
        "ExitCode=0:0", f"ExitCode={exit_code}"
    )
    st = job_status(parse_fields(line))
    assert st.state is want
    assert st.restart_count == int(restarts)
    assert st.nodes == ("localhost",)
    if want is JobState.FAILED and exit_code == "3:0":
        assert st.exit_code == 3
    if want is JobState.CANCELLED:
        assert st.exit_code == 128 + 15
    if reason not in ("None",):
        assert reason in st.detail


def test_exit_77_is_a_budget_stop_only_when_the_node_recorded_one() -> None:
    """Exit `Exit.STOPPED`: Slurm says FAILED. tgnb says cancelled at the budget when the run's
    events hold the node's ``BudgetReached`` (`tgnb.train.budget`), as the local engine ends a run
    stopped at its budget; otherwise it is the program's own exit 77, a failure."""
    line = RUNNING.replace("JobState=RUNNING Reason=None", "JobState=FAILED Reason=NonZeroExitCode")
    st = job_status(parse_fields(line.replace("ExitCode=0:0", f"ExitCode={int(Exit.STOPPED)}:0")))
    assert (st.state, st.exit_code) == (JobState.FAILED, 77)
    own = budget.settle(st, [])
    assert own.state is JobState.FAILED and "no budget stop was recorded" in own.detail, own
    reached = Event(utcnow(), "run", BUDGET_REACHED, "budget reached at $2.10 of $2.00: stopping")
    stopped = budget.settle(st, [reached])
    assert (stopped.state, stopped.detail) == (
        JobState.CANCELLED,
        "budget reached at $2.10 of $2.00",
    )


def test_completing_right_after_a_requeue_is_requeued() -> None:
    """As scontrol shows a job for a few seconds after ``scontrol requeue`` (seen on 22.05)."""
    base = RUNNING.replace("JobState=RUNNING", "JobState=COMPLETING")
    requeued = job_status(parse_fields(base + "EndTime=Unknown"))
    assert requeued.state is JobState.REQUEUED
    ending = job_status(parse_fields(base + "EndTime=2026-11-29T19:03:20"))
    assert ending.state is JobState.RUNNING
