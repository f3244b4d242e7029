"""Render once: `SlurmBackend.submit` writes and ``sbatch``es the script `preflight` rendered
(`Session.launch` hands it over), not a second render. Real Slurm (`.ci/slurm-up`), with
``fake_train.sh`` as the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm.render import SCRIPT_NAME

from .conftest import fake_train
from .test_slurm_jobs import make_backend

MARK = "# rendered by preflight, sent by submit (test)"


@pytest.mark.slurm
def test_submit_sends_the_script_preflight_rendered(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    backend = make_backend(tmp_path)
    spec = RunSpec(
        name="once",
        train={},
        resources=Resources(nodes=1, gpus_per_node=0, preemptible=True),
        env=fake_train(sleep=1),
    )
    script, config, env = backend.preflight(spec)
    job = backend.submit(spec, (script + MARK + "\n", config, env))
    cleanup_jobs.append(job)
    sent = (Path(backend.run_dir(job)) / SCRIPT_NAME).read_text()
    assert sent == script + MARK + "\n"
    assert backend.wait(job, timeout=120).state is JobState.SUCCEEDED
