"""The ``tg`` CLI shipped with the SDK, run as a subprocess against the emulator.

The commands are the seed document's (``together-preemptible-compute.txt``), without the word
``beta`` that version 3 of the CLI dropped. ``TOGETHER_BASE_URL`` points tg at the emulator.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle

pytestmark = pytest.mark.skipif(shutil.which("tg") is None, reason="the tg CLI is not installed")


def tg(emulator: EmulatorHandle, *args: str, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.run(
        ["tg", *args],
        env={**os.environ, **emulator.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_seed_commands_show_desired_and_allocated(emulator: EmulatorHandle) -> None:
    created = tg(
        emulator,
        *("clusters", "create", "--name", "my-cluster", "--region", "us-central-2"),
        *("--gpu-type", "RTX_6000_PCI", "--cluster-type", "KUBERNETES", "--num-gpus", "8"),
        *("--billing-type", "ON_DEMAND", "--nvidia-driver-version", "570"),
        *("--cuda-version", "12.8", "--num-preemptible-gpus", "8"),
        *("--project", "proj-seed", "--non-interactive", "--json"),
    )
    cluster = json.loads(created.stdout)
    cid = cluster["cluster_id"]
    assert cluster["desired_preemptible_gpus"] == 8
    assert cluster["project_id"] == "proj-seed"

    tg(emulator, "clusters", "update", cid, "--num-preemptible-gpus", "16")

    def retrieve() -> dict[str, Any]:
        return dict(json.loads(tg(emulator, "clusters", "retrieve", cid, "--json").stdout))

    got = retrieve()
    assert got["status"] == "Ready"
    assert got["desired_preemptible_gpus"] == 16
    assert 0 <= got["allocated_preemptible_gpus"] <= 16
    # wait through the admin view (cheap), then read it back through tg once more
    wait_until(lambda: sum(n["state"] == "running" for n in emulator.nodes(cid)) == 3, timeout=90)
    assert retrieve()["allocated_preemptible_gpus"] == 16

    sent = [(e["method"], e["path"], e["body"]) for e in emulator.requests()]
    assert sent[0][:2] == ("POST", "/v1/compute/clusters")
    assert sent[0][2]["num_preemptible_gpus"] == 8 and sent[0][2]["project_id"] == "proj-seed"
    assert ("PUT", f"/v1/compute/clusters/{cid}", {"num_preemptible_gpus": 16}) in sent


def test_tg_resolves_the_project_through_whoami(emulator: EmulatorHandle) -> None:
    """Without a project, tg asks /v3/whoami first; then it lists the clusters."""
    env = {k: v for k, v in os.environ.items() if k != "TOGETHER_PROJECT_ID"}
    env.update({k: v for k, v in emulator.env.items() if k != "TOGETHER_PROJECT_ID"})
    proc = subprocess.run(
        ["tg", "clusters", "list", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    paths = [e["path"] for e in emulator.requests()]
    assert paths[0] == "/v3/whoami"
    assert "/v1/compute/clusters" in paths


def test_tg_with_a_refused_key_fails_without_echoing_it(emulator: EmulatorHandle) -> None:
    wrong = "sk-refused-abcdef123"
    proc = subprocess.run(
        ["tg", "clusters", "list", "--json"],
        env={**os.environ, **emulator.env, "TOGETHER_API_KEY": wrong},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "invalid or missing API key" in proc.stdout + proc.stderr
    assert wrong not in proc.stdout + proc.stderr
    assert [e["status"] for e in emulator.requests()] == [401]


def test_tg_shows_why_an_unknown_cluster_fails(emulator: EmulatorHandle) -> None:
    proc = subprocess.run(
        ["tg", "clusters", "update", "no-such-id", "--num-preemptible-gpus", "16"],
        env={**os.environ, **emulator.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "cluster 'no-such-id' not found" in proc.stdout + proc.stderr
