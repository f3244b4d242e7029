"""A run's budget held on its node (`tgnb.train.budget`): priced from the run directory's
``events.jsonl``, which holds the earlier attempts (here written as a requeued job leaves them),
at the prices of the run file the engine wrote (``run.json``; ``TGNB_BUDGET`` in a job rendered
before it). The stop on a real Slurm with real training is
tests/backends/slurm/test_slurm_budget.py; here the launcher of a run whose earlier attempts
spent its budget, for real in a process of its own; the notice alone; and a built-in run alone
under ``python -m tgnb.train`` stopped at its budget. Nothing is faked."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tgnb.events import (
    BUDGET_NOTICE,
    BUDGET_REACHED,
    JOB_PLACED,
    JOB_RELEASED,
    RUN_EXITED,
    RUN_STARTED,
    Event,
    read_jsonl,
    utcnow,
)
from tgnb.prices import Prices
from tgnb.runs import node
from tgnb.runs.budget import Budget
from tgnb.runs.runfile import RunFile
from tgnb.runs.spec import Resources, RunSpec
from tgnb.train.budget import BudgetWatch

#: $5 a GPU-hour on the standard node ``localhost``, one GPU: an hour of it is $5.
BUDGET = Budget(10.0, Prices(standard=5.0, preemptible=2.5), gpus=1)


def attempts(run_dir: Path, hours: float) -> None:
    """An earlier attempt of run ``r`` that held one GPU of a standard node for `hours`, as the
    engine records it (`tgnb.runs.meter`), its program's own records inside."""
    end = utcnow()
    start = end - timedelta(hours=hours)
    held = {"gpus": 1, "node_class": "standard", "restart_count": 0}
    evs = [Event(start, "tgnb", JOB_PLACED, "", "localhost", "r", held),
           Event(start, "run", RUN_STARTED, "", "localhost", "r"),
           Event(end, "run", RUN_EXITED, "", "localhost", "r", {"exit_code": 75}),
           Event(end, "tgnb", JOB_RELEASED, "", "localhost", "r",
                 {**held, "exit_code": 75, "cause": "preempted"})]  # fmt: skip
    run_dir.mkdir(exist_ok=True)
    with open(run_dir / node.EVENTS, "a", encoding="utf-8") as fh:
        fh.writelines(e.to_json() + "\n" for e in evs)


def reasons(run_dir: Path) -> list[str]:
    return [e.reason for e in read_jsonl(run_dir / node.EVENTS)]


def test_a_launcher_whose_run_spent_its_budget_before_exits_77_and_starts_nothing(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "r"
    attempts(run_dir, hours=2.2)  # $11: past the budget
    env = {**os.environ, node.BUDGET_ENV: BUDGET.to_json(), node.RUN_ENV: "r"}
    argv = ["--standalone", "--nnodes=1", "--nproc_per_node=1",
            *node.runtime_args(str(run_dir / node.CONFIG), str(run_dir))]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "tgnb.train.launch", *argv], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == node.Exit.STOPPED == 77, proc.stderr[-2000:]
    assert "the run's budget is spent; exit 77" in proc.stderr
    before = [JOB_PLACED, RUN_STARTED, RUN_EXITED, JOB_RELEASED]
    # the launcher's own meter opens and closes its (empty) stretch around the refusal
    assert reasons(run_dir) == [*before, JOB_PLACED, BUDGET_NOTICE, BUDGET_REACHED, JOB_RELEASED]
    assert read_jsonl(run_dir / node.EVENTS)[-1].data["cause"] == "budget"
    reached = [e for e in read_jsonl(run_dir / node.EVENTS) if e.reason == BUDGET_REACHED]
    assert reached[0].data["budget_usd"] == 10.0 and reached[0].data["spent_usd"] >= 10.0


def test_a_launcher_holds_the_budget_of_its_run_file(tmp_path: Path) -> None:
    """What the engines give a node: the budget in the run file its workers read (no
    ``TGNB_BUDGET``): a run whose earlier attempts spent it exits 77 and starts nothing."""
    run_dir = tmp_path / "r"
    attempts(run_dir, hours=2.2)  # $11: past the budget
    spec = RunSpec("r", {"algorithm": "grpo"}, Resources(gpus_per_node=1, preemptible=False),
                   budget_usd=10.0, prices=BUDGET.prices)  # fmt: skip
    assert Budget.of(spec) == BUDGET
    (run_dir / node.RUN_FILE).write_text(RunFile(spec, 1.8e9).to_json())
    env = {k: v for k, v in os.environ.items() if k not in (node.BUDGET_ENV, node.METERED_ENV)}
    argv = ["--standalone", "--nnodes=1", "--nproc_per_node=1",
            *node.runtime_args(str(run_dir / node.RUN_FILE), str(run_dir))]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "tgnb.train.launch", *argv],
                          env={**env, node.RUN_ENV: "r"}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == node.Exit.STOPPED == 77, proc.stderr[-2000:]
    assert "the run's budget is spent; exit 77" in proc.stderr
    assert reasons(run_dir)[-4:] == [JOB_PLACED, BUDGET_NOTICE, BUDGET_REACHED, JOB_RELEASED]
    (run_dir / node.RUN_FILE).write_text("{broken")  # refused in one line, before any worker
    proc = subprocess.run([sys.executable, "-m", "tgnb.train.launch", *argv],
                          env={**env, node.RUN_ENV: "r"}, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == node.Exit.BAD_CONFIG, proc.stderr[-2000:]
    assert "is not one tgnb wrote" in proc.stderr


def test_the_notice_comes_once_and_only_node_0_records(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    attempts(run_dir, hours=1.7)  # $8.50: past 80 %, under the budget
    other = BudgetWatch(str(run_dir), "r", BUDGET, record=False)  # another node of the run
    before = [JOB_PLACED, RUN_STARTED, RUN_EXITED, JOB_RELEASED]
    assert other.check() == (False, False) and reasons(run_dir) == before
    watch = BudgetWatch(str(run_dir), "r", BUDGET)
    assert watch.check() == (False, False)  # under the budget; no attempt started since
    assert watch.check() == (False, False)
    assert reasons(run_dir) == [*before, BUDGET_NOTICE]


@pytest.mark.slow
def test_a_built_in_run_alone_is_stopped_at_its_budget_with_a_sealed_checkpoint(
    tmp_path: Path, train: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m tgnb.train`` alone (a one-process built-in task, real TRL on the CPU), as a
    Slurm or Kubernetes node runs it with ``TGNB_BUDGET``: about 10 s of its GPU buy the budget.
    It leaves through the runtime's ``SystemExit(75)``, which the node's hold turns into 77."""
    from tgnb.train.checkpoint import checkpoint_dirs, read_marker

    ten_seconds = Budget(1.0, Prices(standard=360.0, preemptible=360.0), gpus=1)
    monkeypatch.setenv(node.BUDGET_ENV, ten_seconds.to_json())
    run_dir = tmp_path / "r"
    proc = train(["--set", "max_steps=100000", "--set", "checkpoint.watch_drain=false",
                  "--run-dir", str(run_dir)], timeout=600)  # fmt: skip
    assert proc.returncode == node.Exit.STOPPED, proc.stderr[-3000:]
    assert "stopped at the run's budget, a sealed checkpoint; exit 77" in proc.stderr
    said = reasons(run_dir)
    assert said.count(BUDGET_NOTICE) == said.count(BUDGET_REACHED) == 1, said
    sealed = [m.step for p in checkpoint_dirs(run_dir / "checkpoints") if (m := read_marker(p))]
    last = [e for e in read_jsonl(run_dir / node.EVENTS) if e.reason == RUN_EXITED][-1]
    assert last.data["checkpoint_step"] in sealed and last.data["checkpoint_step"] < 100_000


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "is not a run budget as tgnb writes it (JSONDecodeError"),
        ('{"gpus": 1}', "is not a run budget as tgnb writes it (KeyError: 'prices')"),
        (
            '{"budget_usd": 1, "prices": {"standard": 1, "preemptible": 1}, "gpus": "8"}',
            "gpus must be a whole number >= 1, got '8'",
        ),
        (
            '{"budget_usd": 1, "prices": {"standard": 1, "preemptible": 1}, "gpus": 0}',
            "gpus must be a whole number >= 1, got 0",
        ),
        (
            '{"budget_usd": NaN, "prices": {"standard": 1, "preemptible": 1}, "gpus": 1}',
            "budget_usd must be a number of dollars, got nan",
        ),
        (
            '{"budget_usd": Infinity, "prices": {"standard": 1, "preemptible": 1}, "gpus": 1}',
            "budget_usd must be a number of dollars, got inf",
        ),
        (
            '{"budget_usd": 1, "prices": {"standard": -1, "preemptible": 1}, "gpus": 1}',
            "the standard price must be >= 0",
        ),
    ],
)
def test_a_bad_budget_variable_is_refused_on_the_node_in_one_line(
    tmp_path: Path, text: str, said: str
) -> None:
    """The node's ``TGNB_BUDGET`` checked as strictly as the launch checks a budget: one line
    naming what is wrong and exit 2 (a bad config), before the program starts (it would have
    printed "started")."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    env = {**os.environ, node.BUDGET_ENV: text, node.RUN_ENV: "r"}
    cmd = [sys.executable, "-m", "tgnb.train", "--set", "algorithm=script",
           "--set", "command=[python, -c, 'print(\"started\")']", "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == node.Exit.BAD_CONFIG, (proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tgnb: TGNB_BUDGET"), proc.stderr
    assert said in lines[0], lines
    assert "started" not in proc.stdout and "Traceback" not in proc.stderr


IGNORES_SIGTERM = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_program_that_ignores_the_budgets_sigterm_is_killed_after_its_grace(
    tmp_path: Path,
) -> None:
    """A ``command=`` that never imports tgnb and ignores SIGTERM, as a Slurm or Kubernetes node
    runs it with ``TGNB_BUDGET``: at the budget the node sends SIGTERM, waits the program's grace
    (`GRACE_SECONDS`, here 3 s by `GRACE_ENV`), kills what is left, and exits 77 with the node's
    release recorded."""
    from tgnb.train.budget import GRACE_ENV

    wd, run_dir = tmp_path / "wd", tmp_path / "r"
    wd.mkdir()
    run_dir.mkdir()
    (wd / "ignore.py").write_text(IGNORES_SIGTERM)
    dollar_a_second = Budget(1.0, Prices(standard=3600.0, preemptible=3600.0), gpus=1)
    env = {**os.environ, node.BUDGET_ENV: dollar_a_second.to_json(), node.RUN_ENV: "r",
           node.GPUS_ENV: "1", GRACE_ENV: "3"}  # fmt: skip
    cmd = [sys.executable, "-m", "tgnb.train", "--set", "algorithm=script",
           "--set", "command=[python, ignore.py]", "--run-dir", str(run_dir)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=wd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == node.Exit.STOPPED, proc.stderr[-2000:]
    assert "started" in proc.stdout
    said = "did not stop within 3 s of the budget's SIGTERM: killed 1 process"
    assert said in proc.stderr, proc.stderr[-2000:]
    released = [e for e in read_jsonl(run_dir / node.EVENTS) if e.reason == JOB_RELEASED]
    assert [e.data["cause"] for e in released] == ["budget"], released
    assert [e.data["exit_code"] for e in released] == [77], released
