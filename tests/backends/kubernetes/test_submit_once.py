"""Render once: `KubernetesBackend.submit` sends the objects `preflight` built (`Session.launch`
hands them over), not a second build. Against the fake API server of conftest.py (none can run
here): the real client's POST bodies are what is checked."""

from __future__ import annotations

import dataclasses
from typing import Any

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.kubernetes.backend import KubernetesBackend

NS = "research"
SPEC = RunSpec(
    name="once",
    train={"algorithm": "grpo", "model": "tgnb/tiny", "dataset": "arithmetic", "max_steps": 10},
    image="ghcr.io/example/tgnb:0.1",
    resources=Resources(nodes=1, gpus_per_node=1, preemptible=True),
)


def test_submit_sends_what_preflight_built(fake_api: Any, api_client: Any) -> None:
    backend = KubernetesBackend(api_client, NS, poll_interval=0.01)
    objs = backend.preflight(SPEC)
    meta = objs.job.metadata
    meta.annotations = {**(meta.annotations or {}), "test/built": "by preflight"}  # this build
    assert backend.submit(SPEC, objs) == "once"
    (job,) = [r.body for r in fake_api.sent("POST") if r.path.endswith("/jobs")]
    assert job["metadata"]["annotations"]["test/built"] == "by preflight"
    # without what preflight built, submit builds the objects itself: the same ones, unmarked
    fake_api.requests.clear()
    fake_api.route("POST", f"/apis/batch/v1/namespaces/{NS}/jobs", (201, job))
    other = dataclasses.replace(SPEC, name="twice")
    backend.submit(other)
    (again,) = [r.body for r in fake_api.sent("POST") if r.path.endswith("/jobs")]
    assert "test/built" not in again["metadata"]["annotations"]
    assert again["metadata"]["name"] == "twice"
