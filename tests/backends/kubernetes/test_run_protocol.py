"""The Backend protocol's one mode, seen from a `Run` over the Kubernetes backend: `status` is the
engine's word and a read writes nothing; `Run.sync` alone brings the run store up to the engine;
an engine that fails is raised typed, or reported in a listing, never swallowed.

Fakes the Kubernetes API server at the HTTP boundary (none can run here: conftest.py); the real
``kubernetes`` client, backend, run store (sqlite) and `Run` are above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.kubernetes.backend import KubernetesBackend
from tgnb.errors import TgnbError
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore

from .conftest import status_body

NS = "research"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
SPEC = RunSpec(
    name="grpo-tiny",
    train={"algorithm": "grpo", "model": "tgnb/tiny", "max_steps": 10},
    image="ghcr.io/example/tgnb:0.1",
    resources=Resources(nodes=1, gpus_per_node=1, preemptible=True),
)


def recorded_run(tmp_path: Path, api_client: Any) -> tuple[Run, RunStore]:
    """A run as `Session.launch` records it: the record, then its job, once."""
    store = RunStore(tmp_path)
    rec = store.create(SPEC, backend="kubernetes", cluster_id="c-1", run_dir=None)
    store.add_job(rec.id, "grpo-tiny")
    backend = KubernetesBackend(api_client, NS, poll_interval=0.01)
    return Run(store.get(rec.id), store, backend), store


def test_reads_ask_the_engine_and_write_nothing_sync_records_once(
    tmp_path: Path, fake_api: Any, api_client: Any, k8s: Any
) -> None:
    run, store = recorded_run(tmp_path, api_client)
    fake_api.route("GET", f"{JOBS}/grpo-tiny", (200, k8s.job("grpo-tiny")))
    fake_api.route("GET", PODS, (200, k8s.pods(k8s.pod("grpo-tiny-0-a", run="grpo-tiny"))))
    assert run.status.state is JobState.RUNNING and run.state is JobState.RUNNING
    assert "running" in repr(run) and run.summary()["state"] == "running"
    assert run.refresh().state is JobState.PENDING  # reads wrote nothing
    assert [h.state for h in store.history(run.id)] == [JobState.PENDING]
    assert run.sync().state is JobState.RUNNING
    run.sync()  # nothing changed since: nothing more recorded
    assert [h.state for h in store.history(run.id)] == [JobState.PENDING, JobState.RUNNING]
    assert store.get(run.id).nodes == ("gpu-preemptible-dp-1",)

    done = k8s.job("grpo-tiny", conditions=[k8s.condition("Complete")])
    fake_api.route("GET", f"{JOBS}/grpo-tiny", (200, done))
    fake_api.route("GET", PODS, (200, k8s.pods(k8s.pod("grpo-tiny-0-a", run="grpo-tiny",
                                                        phase="Succeeded", exit_code=0))))  # fmt: skip
    assert run.wait(timeout=10, poll=0.01, progress=False).state is JobState.SUCCEEDED
    assert store.get(run.id).state is JobState.SUCCEEDED  # the watcher synced the end


def test_an_engine_failure_is_raised_typed_and_reported_in_a_listing(
    tmp_path: Path, fake_api: Any, api_client: Any
) -> None:
    run, store = recorded_run(tmp_path, api_client)
    fake_api.route(
        "GET", f"{JOBS}/grpo-tiny", (500, status_body(500, "InternalError", "etcd down"))
    )
    with pytest.raises(TgnbError, match="etcd down"):
        run.status  # noqa: B018
    with pytest.raises(TgnbError, match="etcd down"):
        run.sync()
    reported = run.report()  # what a panel or `%tg runs` shows
    assert reported.state is JobState.UNKNOWN and "etcd down" in reported.detail
    assert store.get(run.id).state is JobState.PENDING  # nothing was recorded of the failure


def test_a_sync_never_undoes_a_newer_change(tmp_path: Path) -> None:
    """The store's compare-and-set: a writer that read PENDING does not overwrite the RUNNING a
    supervisor recorded meanwhile."""
    store = RunStore(tmp_path)
    rec = store.create(SPEC, backend="local", cluster_id="c-1", run_dir=None)
    store.set_state(rec.id, JobState.RUNNING, "running on n1", restart_count=1)
    store.set_state(rec.id, JobState.UNKNOWN, "stale", expect=(JobState.PENDING, 0))
    assert store.get(rec.id).state is JobState.RUNNING
    store.set_state(rec.id, JobState.REQUEUED, "n1 removed", expect=(JobState.RUNNING, 1))
    assert store.get(rec.id).state is JobState.REQUEUED


def test_the_session_and_the_engine_note_one_job(tmp_path: Path) -> None:
    """The local engine notes its supervisor's pid as it starts; the session's record of the job
    afterwards keeps it (no second record, nothing lost)."""
    store = RunStore(tmp_path)
    rec = store.create(SPEC, backend="local", cluster_id="c-1", run_dir=None)
    store.add_job(rec.id, rec.id, pid=4242)
    store.add_job(rec.id, rec.id)
    store.add_job(rec.id, rec.id, children=[1, 2])
    (job,) = store.get(rec.id).jobs
    assert dict(job.info) == {"pid": 4242, "children": [1, 2]}
