"""A run's ``budget_usd`` on a real Slurm. A ``script`` run's node holds it (its launcher: the last
test). Other runs have no process of tgnb's beside a Slurm job, so the
run's watcher (`tgnb.runs.Run.wait`) holds the budget at each poll (`tgnb.runs.budget`): a
``BudgetNotice`` at 80 %, then at the budget a ``BudgetReached`` and the stop `Run.stop` makes
(scancel: the job gets SIGTERM and ends cancelled).

The training runtime is ``fake_train.sh`` (it writes the runtime's ``RunStarted``, sleeps, and on
SIGTERM exits 75 as a checkpointed runtime does): the real runtime's checkpoint at a stop is
test_budget.py's on the local engine; here the point is the Slurm plumbing. The prices are
made up so that the budget is spent in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import wait_until
from tgnb.events import BUDGET_NOTICE, BUDGET_REACHED, CHECKPOINT_SAVED, RUN_REQUEUED
from tgnb.prices import Prices
from tgnb.runs import Run
from tgnb.runs.node import STOPPED_DETAIL, Exit
from tgnb.runs.spec import JobState, Resources, RunSpec
from tgnb.runs.store import RunStore
from tgnb.train.checkpoint import checkpoint_dirs, read_marker

from .test_slurm_exits import LOOP, submit
from .test_slurm_jobs import make_backend
from .test_slurm_training import metric_steps

pytestmark = pytest.mark.slurm

GPUS = 1  # one process, no torchrun: fake_train.sh stands in for it
#: Dollars per GPU-hour that make `BUDGET` last about `SECONDS` of the run's GPU.
BUDGET, SECONDS = 1.0, 4.0
PRICE = BUDGET * 3600 / (GPUS * SECONDS)


def test_the_watcher_stops_a_slurm_run_at_its_budget(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    backend = make_backend(tmp_path)
    assert backend.holds_budget is False  # nothing of tgnb's beside the job: the watcher holds it
    spec = RunSpec(
        name="slurm-budgeted",
        train={"sleep": 300},
        resources=Resources(nodes=1, gpus_per_node=GPUS, preemptible=True),
        budget_usd=BUDGET,
        prices=Prices(PRICE, PRICE),
    )
    store = RunStore(tmp_path / "home")
    record = store.create(spec, backend=backend.name, run_dir=backend.run_dir_for(spec.name))
    job = backend.submit(spec)
    cleanup_jobs.append(job)
    store.add_job(record.id, job)
    run = Run(store.get(record.id), store, backend)

    status = run.wait(timeout=120, poll=0.5, progress=False)
    assert status.state is JobState.CANCELLED, status
    told = capsys.readouterr().err
    assert "run slurm-budgeted: 80 % of the budget spent" in told, told
    assert "stopping the run (it checkpoints)" in told, told

    evs = run.run_events()
    reasons = [e.reason for e in evs]
    assert reasons.count(BUDGET_NOTICE) == reasons.count(BUDGET_REACHED) == 1, reasons
    notice = next(e for e in evs if e.reason == BUDGET_NOTICE)
    reached = next(e for e in evs if e.reason == BUDGET_REACHED)
    assert notice.time <= reached.time
    assert notice.data["spent_usd"] >= 0.8 * BUDGET and reached.data["spent_usd"] >= BUDGET
    assert run.summary()["cost_usd"] >= BUDGET  # the cockpit reads the same dollars
    log = "\n".join(run.logs())
    assert "fake-train: TERM" in log, log  # the job got the stop's SIGTERM (it checkpoints)


@pytest.mark.slow
def test_a_script_run_left_alone_is_stopped_at_its_budget_by_its_node(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    """Nothing waits on the run (no `Run.wait`: the notebook is closed); only the job's state is
    read through the backend. The node's launcher holds the budget (`tgnb.train.budget`): a
    ``BudgetNotice``, then a ``BudgetReached``, the program's checkpoint sealed on the SIGTERM a
    preemption sends, and exit `Exit.STOPPED`: not requeued, the job ends cancelled. Real
    training (a plain PyTorch loop through the ``Checkpointer``, one process under torchrun);
    the prices are made up so that the budget is spent in seconds."""
    backend, job, run_dir = submit(
        tmp_path, cleanup_jobs, "script-budgeted", LOOP, {"script": "loop.py",
        "args": ["--steps", "100000", "--sleep", "0.05"]},
        resources=Resources(nodes=1, gpus_per_node=GPUS, preemptible=True),
        budget_usd=BUDGET, prices=Prices(PRICE, PRICE),
    )  # fmt: skip
    assert "TGNB_BUDGET" in (run_dir / "job.sbatch").read_text()
    final = wait_until(lambda: (s := backend.status(job)).state.finished and s, 300,
                       what="the job to end", every=0.5)  # fmt: skip
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.CANCELLED, (final, log[-3000:])
    assert (final.exit_code, final.detail, final.restart_count) == (Exit.STOPPED, STOPPED_DETAIL, 0)
    assert "stopped at its budget, a sealed checkpoint" in log, log[-3000:]

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
