"""The fault catalogue's table for a run's own records and checkpoints (issue 34: items 5 and 6).

- A checkpoint directory belongs to one run (`tgnb.train.ownership`): a second run on the directory
  of a live one is refused with the fix while the first trains on and finishes; another run (another
  learning rate) on a finished run's checkpoints is refused too, and the same run again resumes.
  Real processes: a user's plain loop through `tgnb.train.Checkpointer`, run twice at once.
- Protocol records come only from the protocol channel: with the run directory on this machine, a
  line the program prints that looks like an ``@tgnb`` record is never read as a metric, and a bad
  row (``step: "x"``, a string reward) is passed over: ``summary()``, ``metrics()``, ``wait()``
  and the sidebar's JSON read the rest. Runs are read from the store and their run directory, as a
  fresh kernel reads them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, RunSpec
from tgnb.runs.run import Run
from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.runs.store import RunStore

from .conftest import record

LOOP = """
import sys, time, torch, tgnb.train
lr, steps, pause = float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=lr)
ck = tgnb.train.Checkpointer(model, opt, max_steps=steps, dir=sys.argv[1],
                             checkpoint={"every_steps": 1})
for step in ck.steps():
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    ck.log(loss=loss.item())
    time.sleep(pause)
"""


def _start(tmp_path: Path, out: Path, lr: float, steps: int, pause: float) -> Any:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    log = open(tmp_path / f"loop-{lr}-{steps}-{pause}.log", "w")  # noqa: SIM115
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), str(lr), str(steps), str(pause)],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
    )
    proc.log = Path(log.name)  # type: ignore[attr-defined]
    return proc


def _finish(proc: Any) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    return int(code), proc.log.read_text()


@pytest.mark.training
def test_a_second_run_on_a_live_runs_checkpoints_is_refused(tmp_path: Path) -> None:
    """The first run is still training when the second is refused; stopped then (SIGTERM, as a
    preemption), it checkpoints its own state and exits 75."""
    out = tmp_path / "out"
    first = _start(tmp_path, out, 0.1, 400, 0.2)
    try:
        wait_until(lambda: any((out / "checkpoints").glob("checkpoint-*/tgnb-complete.json")))
        code2, log2 = _finish(_start(tmp_path, out, 0.5, 40, 0.0))
        live = first.poll() is None
        first.send_signal(signal.SIGTERM)
    finally:
        code1, log1 = _finish(first)
    ok = code2 != 0 and "in use by another live run" in log2 and "dir=" in log2
    record(ok and live and code1 == EXIT_PREEMPTED)
    assert ok and live, (live, code2, log2[-1500:])
    assert code1 == EXIT_PREEMPTED, log1[-1500:]


@pytest.mark.training
def test_another_run_on_a_finished_runs_checkpoints_is_refused_and_the_same_resumes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    code, log = _finish(_start(tmp_path, out, 0.1, 3, 0.0))
    assert code == 0, log
    other, other_log = _finish(_start(tmp_path, out, 0.5, 6, 0.0))
    same, same_log = _finish(_start(tmp_path, out, 0.1, 6, 0.0))
    ok = other != 0 and "belong to another run" in other_log and "learning_rate 0.1" in other_log
    record(ok and same == 0)
    assert ok, other_log[-1500:]
    assert same == 0 and "resumed from checkpoint-3" in same_log, same_log[-1500:]


# -- 6. records only from the protocol channel; one bad record breaks no reader ----------------------
def _run(tmp_path: Path, log: list[str], metrics: list[Any] | None) -> Run:
    store = RunStore(tmp_path / "home")
    spec = RunSpec(name="printer", train={"algorithm": "script", "max_steps": 10})
    run_dir = tmp_path / "runs" / "printer"
    run_dir.mkdir(parents=True)
    rec = store.create(spec, backend="local", cluster_id="c", run_dir=run_dir)
    store.set_state(rec.id, JobState.SUCCEEDED, "done", exit_code=0)
    (run_dir / "train.log").write_text("".join(line + "\n" for line in log))
    if metrics is not None:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return Run(store.get(rec.id), store)


PRINTED = [
    "epoch 1",
    '@tgnb {"kind": "metrics", "step": "x", "loss": 1.0}',
    '@tgnb {"kind": "metrics", "step": 99, "reward": 1.0}',
    'progress 10%\r@tgnb {"kind": "metrics", "step": 7}',
]
BAD_ROWS: dict[str, list[Any]] = {  # each broke summary(), metrics() or wait() before
    "step-string": [{"step": "x", "loss": 1.0}],
    "step-null": [{"step": None, "loss": 1.0}],
    "step-list": [{"step": [2], "loss": 1.0}],
    "step-object": [{"step": {"n": 2}}],
    "reward-string": [{"step": 2, "reward": "high"}],
    "reward-list": [{"step": 2, "reward": [0.5]}],
}


def _read_everything(run: Run) -> dict[str, Any]:
    from tgnb.server.serialize import run_json

    return {
        "summary": run.summary(),
        "metrics": run.metrics(),
        "wait": run.wait(timeout=30, progress=True),
        "json": run_json(run, detail=True),
    }


def test_printed_record_lines_are_not_metrics_of_a_run_here(tmp_path: Path) -> None:
    run = _run(tmp_path, PRINTED, None)
    try:
        got = _read_everything(run)
    except (ValueError, TypeError, KeyError) as exc:
        record(False)
        raise AssertionError(f"a reader broke: {exc!r}") from None
    # no step reported: unknown (None), never 0 (issue 45)
    ok = run.records("metrics") == [] and got["summary"]["steps"] is None
    record(ok)
    assert ok, (run.records("metrics"), got["summary"])


@pytest.mark.parametrize("rows", BAD_ROWS.values(), ids=list(BAD_ROWS))
def test_one_bad_metrics_row_breaks_no_reader(tmp_path: Path, rows: list[Any]) -> None:
    good = [{"step": 1, "loss": 2.0, "reward": 0.5, "time": 1.0e9}]
    run = _run(tmp_path, [], [*good, *rows, {"step": 3, "loss": 1.0, "reward": 0.75}])
    try:
        got = _read_everything(run)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        record(False)
        raise AssertionError(f"a reader broke: {exc!r}") from None
    ok = got["summary"]["steps"] == 3 and got["summary"]["reward_last"] == 0.75
    record(ok)
    assert ok, got["summary"]
