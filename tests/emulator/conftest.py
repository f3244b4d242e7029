"""Fixtures for the emulator's tests: the official SDK pointed at the `emulator` fixture."""

from __future__ import annotations

from typing import Any

import pytest
import together

from tgnb.emulator.testing import EmulatorHandle

SEED_CREATE: dict[str, Any] = {
    "cluster_name": "my-cluster",
    "region": "us-central-2",
    "gpu_type": "RTX_6000_PCI",
    "cluster_type": "KUBERNETES",
    "num_gpus": 8,
    "billing_type": "ON_DEMAND",
    "nvidia_driver_version": "570",
    "cuda_version": "12.8",
}


@pytest.fixture
def sdk(emulator: EmulatorHandle) -> together.Together:
    """The official SDK client, no retries (so every answer is seen as it is)."""
    return together.Together(base_url=emulator.base_url, api_key=emulator.api_key, max_retries=0)


def create(client: together.Together, **overrides: Any) -> Any:
    """Create a cluster from the seed document's parameters, with `overrides`."""
    return client.clusters.create(**{**SEED_CREATE, **overrides})
