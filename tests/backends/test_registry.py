"""Choosing the backend from the attached cluster (no engine is contacted: names only, and the
Slurm backend object, which runs no command when built)."""

from __future__ import annotations

from typing import Any

import pytest

from tgnb.backends.registry import backend_name, choose_backend
from tgnb.cloud import ClusterState
from tgnb.config import Settings
from tgnb.errors import ValidationError
from tgnb.runs.store import RunStore


def _state(kind: str) -> ClusterState:
    return ClusterState(id="c-1", name="prod", type=kind, status="Ready")


def test_backend_follows_where_and_what_the_cluster_is() -> None:
    """Where: what the session attached to (the local emulator or not), never its URL."""
    assert backend_name(_state("SLURM"), local=False) == "slurm"
    assert backend_name(_state("KUBERNETES"), local=False) == "kubernetes"
    assert backend_name(_state("KUBERNETES"), local=True) == "local"
    assert backend_name(_state("SLURM"), local=True) == "local"
    assert backend_name(_state("KUBERNETES"), False, "slurm") == "slurm"
    assert backend_name(_state("KUBERNETES"), True, "kubernetes") == "kubernetes"
    with pytest.raises(ValidationError, match="use one of local, slurm, kubernetes"):
        backend_name(_state("SLURM"), False, "nomad")
    with pytest.raises(ValidationError, match="pass backend="):
        backend_name(_state("OTHER"), False)


def test_choose_builds_the_slurm_backend_and_passes_objects_through(tmp_path: Any) -> None:
    class FakeCloud:  # only what choose_backend reads; no request is made for Slurm
        base_url = "https://api.together.ai"
        settings = Settings(home=tmp_path)

    store = RunStore(tmp_path)
    backend = choose_backend(FakeCloud(), _state("SLURM"), store, local=False)  # type: ignore[arg-type]
    assert backend.name == "slurm"
    same = choose_backend(FakeCloud(), _state("SLURM"), store, backend, local=True)  # type: ignore[arg-type]
    assert same is backend
