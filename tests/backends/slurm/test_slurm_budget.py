"""A run's ``budget_usd`` on a real Slurm: nothing of tgnb's runs beside a Slurm job, so the run's
node holds it (`tgnb.train.budget`), whether anything waits for the run or not: a ``BudgetNotice``
at 80 %, then at the budget a ``BudgetReached``, the program stopped as a preemption stops it (it
seals a checkpoint) and exit 77 (`Exit.STOPPED`): not requeued, the job ends cancelled. Real
training (a plain PyTorch loop through the ``Checkpointer``): under torchrun through the node's
launcher (a script), and alone under the node's ``python -m tgnb.train`` (a command). The prices
are made up so that the budget is spent in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.events import (
    BUDGET_NOTICE,
    BUDGET_REACHED,
    CHECKPOINT_SAVED,
    JOB_PLACED,
    JOB_RELEASED,
    RUN_REQUEUED,
)
from tgnb.prices import Prices
from tgnb.runs import Run
from tgnb.runs.node import Exit
from tgnb.runs.runfile import RunFile
from tgnb.runs.spec import JobState, Resources
from tgnb.runs.store import RunStore
from tgnb.train.checkpoint import checkpoint_dirs, read_marker

from .test_slurm_exits import LOOP, submit
from .test_slurm_training import metric_steps

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

GPUS = 1  # priced for one GPU (the CPU node stands for it): one process
#: Dollars per GPU-hour that make `BUDGET` last about `SECONDS` of the run's GPU.
BUDGET, SECONDS = 1.0, 4.0
PRICE = BUDGET * 3600 / (GPUS * SECONDS)
STEPS = ["--steps", "100000", "--sleep", "0.05"]


def budgeted(tmp_path: Path, cleanup_jobs: list[str], name: str, train: dict[str, Any]) -> Any:
    """`LOOP` run as `train` says with the budget: (backend, job, run dir, spec)."""
    return submit(tmp_path, cleanup_jobs, name, LOOP, train,
                  resources=Resources(nodes=1, gpus_per_node=GPUS, preemptible=True),
                  budget_usd=BUDGET, prices=Prices(PRICE, PRICE))  # fmt: skip


def assert_stopped_at_the_budget(backend: Any, job: str, run_dir: Path) -> None:
    """The job ended cancelled by its node at the budget: exit 77, not requeued, one notice and
    one ``BudgetReached``, a checkpoint sealed after it."""
    final = backend.status(job)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.CANCELLED, (final, log[-3000:])
    assert (final.exit_code, final.restart_count) == (Exit.STOPPED, 0), final
    assert final.detail.startswith("budget reached at $"), final
    assert "stopped at the run's budget, a sealed checkpoint; exit 77" in log, log[-3000:]
    evs = backend.events(job)
    reasons = [e.reason for e in evs]
    assert reasons.count(BUDGET_NOTICE) == reasons.count(BUDGET_REACHED) == 1, reasons
    assert RUN_REQUEUED not in reasons, reasons
    notice = next(e for e in evs if e.reason == BUDGET_NOTICE)
    reached = next(e for e in evs if e.reason == BUDGET_REACHED)
    assert notice.time <= reached.time
    assert notice.data["spent_usd"] >= 0.8 * BUDGET and reached.data["spent_usd"] >= BUDGET
    sealed = {m.step for p in checkpoint_dirs(run_dir / "checkpoints") if (m := read_marker(p))}
    at_stop = [e for e in evs if e.reason == CHECKPOINT_SAVED and e.time >= reached.time]
    assert at_stop and at_stop[-1].data["step"] in sealed, (at_stop, sealed)
    assert 0 < max(metric_steps(run_dir)) < 100_000


def test_a_command_run_is_stopped_at_its_budget_by_its_node_and_run_wait_says_so(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The node's ``python -m tgnb.train`` alone (no torchrun) holds it; `Run.wait` only prints
    the node's notices as they come."""
    backend, job, run_dir, spec = budgeted(tmp_path, cleanup_jobs, "command-budgeted",
                                           {"command": ["python", "loop.py", *STEPS]})  # fmt: skip
    store = RunStore(tmp_path / "home")
    record = store.create(spec, backend=backend.name, run_dir=str(run_dir))
    store.add_job(record.id, job)
    run = Run(store.get(record.id), store, backend)
    status = run.wait(timeout=300, poll=0.5, progress=False)
    assert status.state is JobState.CANCELLED, status
    told = capsys.readouterr().err
    assert "run command-budgeted: 80 % of the budget spent" in told, told
    assert "stopping the run (SIGTERM" in told, told
    assert_stopped_at_the_budget(backend, job, run_dir)
    assert run.summary()["cost_usd"] >= BUDGET  # the cockpit reads the same dollars


def test_a_script_run_left_alone_is_stopped_at_its_budget_by_its_node(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Nothing waits on the run (no `Run.wait`: the notebook is closed); only the job's state is
    read through the backend. The node's launcher (one process under torchrun) holds it."""
    backend, job, run_dir, _ = budgeted(tmp_path, cleanup_jobs, "script-budgeted",
                                        {"script": "loop.py", "args": STEPS})  # fmt: skip
    assert "TGNB_BUDGET" not in (run_dir / "job.sbatch").read_text()  # in the run file
    assert RunFile.load(run_dir / "run.json").budget() is not None
    wait_until(lambda: backend.status(job).state.finished, 300, what="the job to end", every=0.5)
    assert_stopped_at_the_budget(backend, job, run_dir)


PLAIN = """\
import sys, time

code = int(sys.argv[2]) if len(sys.argv) > 2 else 0
for step in range(1, int(sys.argv[1]) + 1):
    time.sleep(0.05)
    print(f"step {step}", flush=True)
sys.exit(code)
"""


def test_a_command_that_never_imports_tgnb_is_metered_and_stopped_at_its_budget(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """A plain ``command=`` with no hook of tgnb's: the node's own process meters it (its
    ``JobPlaced`` / ``JobReleased``) and stops it at the budget (SIGTERM, then exit 77): the job
    ends cancelled "budget reached at $X of $Y", its dollars at least the budget."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    backend, job, run_dir, spec = submit(
        tmp_path, cleanup_jobs, "plain-budgeted", script,
        {"command": ["python", "plain.py", "100000"]},
        resources=Resources(nodes=1, gpus_per_node=GPUS, preemptible=True),
        budget_usd=BUDGET, prices=Prices(PRICE, PRICE),
    )  # fmt: skip
    wait_until(lambda: backend.status(job).state.finished, 300, what="the job to end", every=0.5)
    final = backend.status(job)
    assert final.state is JobState.CANCELLED and final.exit_code == Exit.STOPPED, final
    assert final.detail.startswith("budget reached at $"), final
    reasons = [e.reason for e in backend.events(job)]
    assert reasons.count(JOB_PLACED) == reasons.count(JOB_RELEASED) == 1, reasons
    store = RunStore(tmp_path / "home")
    record = store.create(spec, backend=backend.name, run_dir=str(run_dir))
    store.add_job(record.id, job)
    summary = Run(store.get(record.id), store, backend).summary()
    assert summary["cost_usd"] >= BUDGET and summary["preemptions"] == 0, summary
    assert summary["steps"] is None, summary  # the program reports none


def test_a_programs_own_exit_77_with_no_budget_is_a_failure(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Exit 77 is the budget's only when the node recorded a ``BudgetReached``: a ``command=``
    that exits 77 on its own, with no budget, is a failure of its own, not a budget stop."""
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    backend, job, _, _ = submit(tmp_path, cleanup_jobs, "own-77", script,
                                {"command": ["python", "plain.py", "3", "77"]})  # fmt: skip
    wait_until(lambda: backend.status(job).state.finished, 300, what="the job to end", every=0.5)
    final = backend.status(job)
    assert (final.state, final.exit_code) == (JobState.FAILED, 77), final
    assert "no budget stop was recorded" in final.detail, final
