"""Fixtures for tests/cloud: an API cluster record builder, and a `Cloud` whose SDK client talks to an
``httpx.MockTransport`` (the outermost HTTP boundary only: the real `together` SDK builds, sends and
parses every request)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tgnb.cloud import Cloud, RetryPolicy
from tgnb.config import Secret, Settings

KEY = "tgnb-test-key-5up3r-s3cr3t"


def _cluster_record(**over: Any) -> dict[str, Any]:
    """A Cluster as the API returns it (every required field of the 3.1.1 SDK model)."""
    t0 = "2026-11-29T10:00:00Z"
    rec: dict[str, Any] = {
        "cluster_id": "c-1",
        "cluster_name": "train",
        "cluster_type": "KUBERNETES",
        "region": "us-central-2",
        "gpu_type": "H100_SXM",
        "billing_type": "ON_DEMAND",
        "status": "Ready",
        "project_id": "proj-1",
        "num_gpus": 8,
        "num_reserved_gpus": 0,
        "num_capacity_pool_gpus": 0,
        "num_cpu_workers": 0,
        "desired_preemptible_gpus": 0,
        "allocated_preemptible_gpus": 0,
        "cuda_version": "12.8",
        "nvidia_driver_version": "570",
        "kube_config": "a3ViZS1jb25maWctc2VjcmV0",
        "volumes": [],
        "control_plane_nodes": [],
        "gpu_worker_nodes": [
            {
                "node_id": "n-0",
                "host_name": "gpu-dp-0",
                "status": "Ready",
                "networks": [],
                "num_cpu_cores": 64,
                "num_gpus": 8,
                "memory_gib": 512.0,
                "phase_transitions": [
                    {"phase": "NODE_PHASE_PENDING", "transition_time": t0},
                    {"phase": "NODE_PHASE_RUNNING", "transition_time": "2026-11-29T10:01:00Z"},
                ],
            }
        ],
        "phase_transitions": [{"phase": "CLUSTER_PHASE_READY", "transition_time": t0}],
        "add_ons": [],
        "node_lifecycle_events": [],
    }
    rec.update(over)
    return rec


def _preemptible_node(i: int, phase: str = "NODE_PHASE_RUNNING") -> dict[str, Any]:
    return {
        "node_id": f"p-{i}",
        "host_name": f"gpu-preemptible-dp-{i}",
        "status": "Ready",
        "networks": [],
        "num_cpu_cores": 64,
        "num_gpus": 8,
        "memory_gib": 512.0,
        "phase_transitions": [{"phase": phase, "transition_time": "2026-11-29T10:05:00Z"}],
    }


Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """Every request the SDK sent through the mock transport: (method, path, json body or None)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []

    def record(self, request: httpx.Request) -> None:
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, request.url.path, body))

    @property
    def mutating(self) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] not in ("GET", "HEAD")]


def fast_retry(attempts: int = 3) -> RetryPolicy:
    return RetryPolicy(attempts=attempts, backoff=0.0, max_backoff=0.0, sleep=lambda _s: None)


@pytest.fixture
def mock_cloud() -> Iterator[Callable[..., tuple[Cloud, Recorder]]]:
    """Build a `Cloud` over the real SDK whose HTTP goes to `handler` (the outermost boundary)."""
    clients: list[httpx.Client] = []

    def build(
        handler: Handler, project_id: str | None = "proj-1", attempts: int = 3
    ) -> tuple[Cloud, Recorder]:
        rec = Recorder()

        def wrapped(request: httpx.Request) -> httpx.Response:
            rec.record(request)
            return handler(request)

        from together import Together

        http = httpx.Client(transport=httpx.MockTransport(wrapped))
        clients.append(http)
        settings = Settings(api_key=Secret(KEY), base_url="http://api.test", project_id=project_id)
        client = Together(api_key=KEY, base_url="http://api.test", max_retries=0, http_client=http)
        cloud = Cloud(settings, client=client, max_retries=0, retry=fast_retry(attempts))
        return cloud, rec

    yield build
    for c in clients:
        c.close()


@pytest.fixture
def test_key() -> str:
    """The API key the mock cloud uses (checked absent from every message)."""
    return KEY


@pytest.fixture
def cluster_record() -> Callable[..., dict[str, Any]]:
    """Build a Cluster record as the API returns it; keyword arguments override fields."""
    return _cluster_record


@pytest.fixture
def preemptible_node() -> Callable[..., dict[str, Any]]:
    """Build a preemptible GPU worker node record (``gpu-preemptible-dp-<i>``)."""
    return _preemptible_node
