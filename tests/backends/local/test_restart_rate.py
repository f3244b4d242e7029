"""`checkpoint.auto`'s preemption rate is estimated again at each restart of a local run: the
supervisor reads the emulated cluster (a real emulator daemon over HTTP, through the official SDK),
whose ``node_lifecycle_events`` now hold the preemption that stopped the run, and rewrites the
node's config before the relaunch. The training program is the stand-in
(tests/backends/local/standin_train.py, wrapped by rate_standin.py to record the config each start read);
the preemption is the emulator's own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import wait_until
from tgnb.runs.run import Run
from tgnb.runs.runfile import RunFile
from tgnb.runs.spec import JobState
from tgnb.session import Session

from .test_backend import starts

HERE = Path(__file__).parent
ENV = {"STANDIN_STEP_SECONDS": "0.1"}


@pytest.fixture
def rate_standin(standin: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in, wrapped to record the ``checkpoint:`` section each start read."""
    monkeypatch.setenv("TGNB_TRAIN_MODULE", "rate_standin")
    monkeypatch.setenv("PYTHONPATH", f"{HERE}{os.pathsep}{os.environ['PYTHONPATH']}")


def configs_read(run: Run) -> list[dict[str, Any]]:
    assert run.run_dir is not None
    path = run.run_dir / "standin-checkpoint-config.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.usefixtures("rate_standin")
def test_a_restart_weighs_the_rate_read_again_with_the_preemption_it_followed(
    session: Session,
) -> None:
    policy = {"auto": True, "preemptions_per_hour": 0.5}
    run = session.launch("grpo", name="rerated", max_steps=150, checkpoint=policy, env=ENV)
    wait_until(lambda: run.status.state == JobState.RUNNING and len(run.metrics()) >= 5)
    session.preempt(run.status.nodes[0])
    wait_until(lambda: len(configs_read(run)) == 2, timeout=120)
    first, second = configs_read(run)
    assert (first["restart"], second["restart"]) == ("0", "1")
    launch, restart = first["checkpoint"], second["checkpoint"]
    assert launch["preemptions_source"].startswith("checkpoint.auto weighs 0.5")  # none seen yet
    assert ": 0 over " in launch["preemptions_source"]
    assert launch["observed_preemptions_per_hour"] == pytest.approx(0.5, rel=1e-3)
    # at the restart: the cluster read again, its one preemption in it: (0.5 + 1) / (1 + T)
    source = restart["preemptions_source"]
    assert source.startswith("checkpoint.auto weighs (the cluster re-read at restart 1) ")
    assert ": 1 over " in source and "prior 0.5 as 1 node-hour" in source, source
    assert 1.4 < restart["observed_preemptions_per_hour"] <= 1.5
    assert restart["preemptions_as_of"] > launch["preemptions_as_of"]
    assert restart["preemptions_per_hour"] == 0.5  # the setting stays the prior
    assert run.run_dir is not None
    on_disk = yaml.safe_load((run.run_dir / "config.yaml").read_text())["checkpoint"]
    assert on_disk == restart  # the run file's view, rewritten whole
    read = RunFile.load(run.run_dir / "run.json").train  # the file the relaunch read
    assert read.compact()["checkpoint"] == restart
    assert run.wait(timeout=120).state == JobState.SUCCEEDED, run.status
    assert len(starts(run)) == 2
