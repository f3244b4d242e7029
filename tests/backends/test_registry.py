"""Choosing the backend from the attached cluster (no engine is contacted: names only, and the
Slurm backend object, which runs no command when built)."""

from __future__ import annotations

from typing import Any

import pytest

from tgnb.backends.registry import backend_name, choose_backend, is_loopback
from tgnb.cloud import ClusterState
from tgnb.config import Settings
from tgnb.errors import ValidationError
from tgnb.runs.store import RunStore


def _state(kind: str) -> ClusterState:
    return ClusterState(id="c-1", name="prod", type=kind, status="Ready")


def test_backend_follows_where_and_what_the_cluster_is() -> None:
    real = "https://api.together.ai"
    assert backend_name(_state("SLURM"), real) == "slurm"
    assert backend_name(_state("KUBERNETES"), real) == "kubernetes"
    assert backend_name(_state("KUBERNETES"), "http://127.0.0.1:8765") == "local"
    assert backend_name(_state("SLURM"), "http://localhost:8765/v1") == "local"
    assert backend_name(_state("KUBERNETES"), real, "slurm") == "slurm"
    assert is_loopback("http://[::1]:80") and not is_loopback(real)
    with pytest.raises(ValidationError, match="use one of local, slurm, kubernetes"):
        backend_name(_state("SLURM"), real, "nomad")
    with pytest.raises(ValidationError, match="pass backend="):
        backend_name(_state("OTHER"), real)


def test_choose_builds_the_slurm_backend_and_passes_objects_through(tmp_path: Any) -> None:
    class FakeCloud:  # only what choose_backend reads; no request is made for Slurm
        base_url = "https://api.together.ai"
        settings = Settings(home=tmp_path)

    store = RunStore(tmp_path)
    backend = choose_backend(FakeCloud(), _state("SLURM"), store)  # type: ignore[arg-type]
    assert backend.name == "slurm"
    assert choose_backend(FakeCloud(), _state("SLURM"), store, backend) is backend  # type: ignore[arg-type]
