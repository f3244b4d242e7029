"""400, 401 and 404 answers: status, the ``{code, message, details}`` body, the SDK's exception."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import together

from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .conftest import SEED_CREATE, create


def _post(emulator: EmulatorHandle, body: Any, key: str | None = None) -> httpx.Response:
    return httpx.post(
        emulator.base_url + "/v1/compute/clusters",
        json=body,
        headers={"Authorization": f"Bearer {key or emulator.api_key}"},
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    """One emulator for the read-only validation cases (each starts nothing new)."""
    with running_emulator(tmp_path_factory.mktemp("errors"), time_scale=0.01) as emu:
        yield emu


@pytest.mark.parametrize(
    ("override", "field", "fragment"),
    [
        ({"num_gpus": 12}, "num_gpus", "multiple of 8"),
        ({"num_gpus": 0}, "num_gpus", ">= 8"),
        ({"num_preemptible_gpus": 12, "project_id": "p"}, "num_preemptible_gpus", "multiple of 8"),
        ({"num_preemptible_gpus": -8, "project_id": "p"}, "num_preemptible_gpus", ">= 0"),
        ({"num_preemptible_gpus": "16", "project_id": "p"}, "num_preemptible_gpus", "integer"),
        ({"num_preemptible_gpus": 16}, "project_id", "required when num_preemptible_gpus > 0"),
        ({"gpu_type": "TPU_V5"}, "gpu_type", "unknown value"),
        ({"billing_type": "SPOT"}, "billing_type", "unknown value"),
        ({"region": "mars-1"}, "region", "unknown region"),
        ({"cuda_version": None}, "nvidia_version_id", "required"),
        ({"num_preemptable_gpus": 8}, "num_preemptable_gpus", "unknown field"),
    ],
)
def test_create_rejects_bad_input_with_a_400_body(
    shared: EmulatorHandle, override: dict[str, Any], field: str, fragment: str
) -> None:
    body = {k: v for k, v in {**SEED_CREATE, **override}.items() if v is not None}
    r = _post(shared, body)
    assert r.status_code == 400
    err = r.json()
    assert set(err) == {"code", "message", "details"}
    assert err["code"] == 3  # INVALID_ARGUMENT
    assert fragment in err["message"]
    assert any(d["field"] == field and fragment in d["detail"] for d in err["details"])
    assert shared.health()["clusters"] == 0  # nothing was created


def test_update_rejects_bad_targets(emulator: EmulatorHandle, sdk: together.Together) -> None:
    cid = create(sdk).cluster_id
    for bad in (12, -8):
        with pytest.raises(together.BadRequestError) as info:
            sdk.clusters.update(cid, num_preemptible_gpus=bad)
        assert info.value.status_code == 400
        assert "num_preemptible_gpus" in str(info.value.body)
    r = httpx.put(
        f"{emulator.base_url}/v1/compute/clusters/{cid}",
        json={"num_preemptible_gpus": "16"},
        headers={"Authorization": f"Bearer {emulator.api_key}"},
    )
    assert r.status_code == 400 and "integer" in r.json()["message"]
    assert sdk.clusters.retrieve(cid).desired_preemptible_gpus == 0


def test_wrong_or_missing_key_is_401_and_not_echoed(emulator: EmulatorHandle) -> None:
    wrong = "sk-wrong-key-123456"
    bad = together.Together(base_url=emulator.base_url, api_key=wrong, max_retries=0)
    with pytest.raises(together.AuthenticationError) as info:
        bad.clusters.list()
    assert info.value.status_code == 401
    assert wrong not in str(info.value.body)
    assert emulator.api_key not in str(info.value.body)
    r = httpx.get(emulator.base_url + "/v1/compute/clusters")  # no Authorization header
    assert r.status_code == 401 and r.json()["code"] == 16
    r = httpx.get(emulator.base_url + "/_emulator/health", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401  # the admin endpoints are key-protected too
    statuses = [(e["path"], e["status"]) for e in emulator.requests()]
    assert statuses == [("/v1/compute/clusters", 401), ("/v1/compute/clusters", 401)]


def test_unknown_cluster_is_404(emulator: EmulatorHandle, sdk: together.Together) -> None:
    for call in (
        lambda: sdk.clusters.retrieve("no-such-cluster"),
        lambda: sdk.clusters.update("no-such-cluster", num_preemptible_gpus=8),
        lambda: sdk.clusters.delete("no-such-cluster"),
    ):
        with pytest.raises(together.NotFoundError) as info:
            call()
        body = info.value.body
        assert isinstance(body, dict) and body["code"] == 5
        assert "no-such-cluster" in body["message"]
    r = httpx.get(
        emulator.base_url + "/v1/nothing-here",
        headers={"Authorization": f"Bearer {emulator.api_key}"},
    )
    assert r.status_code == 404 and r.json()["code"] == 5


def test_request_log_keeps_bodies_but_no_secrets(emulator: EmulatorHandle) -> None:
    _post(emulator, {**SEED_CREATE, "oidc_config": {"client_secret": "hush", "client_id": "x"}})
    entry = emulator.requests()[-1]
    assert entry["body"]["cluster_name"] == "my-cluster"
    assert entry["body"]["oidc_config"]["client_secret"] == "***"
    assert "hush" not in str(emulator.requests())
