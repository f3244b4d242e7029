"""The asynchronous RL recipe (`tgnb.tinker.async_rl`) against the real emulator daemon over HTTP,
through ``tgnb.tinker``: the synchronous loop never has rollouts in flight while it trains; the
asynchronous one trains each batch one policy version after the sampler that drew it (at most
`max_off_policy`), with the next batch already submitted while the trainer works; the script runs
from a folder of its own and writes its history, timeline and final checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker
from tgnb.tinker import async_rl

SMALL = {"steps": 4, "prompts_per_step": 4, "group_size": 4, "max_tokens": 1}


def base_model(service: tinker.ServiceClient) -> str:
    return str(service.get_server_capabilities().supported_models[0].model_name)


def test_the_synchronous_loop_never_overlaps_and_the_asynchronous_one_runs_ahead(
    rl_emulator: EmulatorHandle,
) -> None:
    with tinker.ServiceClient() as service:
        model = base_model(service)
        sync = async_rl.run(tinker, service, model, max_off_policy=0, **SMALL)
        ahead = async_rl.run(tinker, service, model, max_off_policy=2, **SMALL)
    assert [h["lag"] for h in sync.history] == [0, 0, 0, 0]
    for k in range(1, 4):  # each batch is submitted once the step before it is published
        assert sync.generator[k][0] >= sync.publishing[k - 1][1]
    assert sync.overlap_seconds() == 0.0
    # batches 0-2 are drawn by version 0 before the first step, batch 3 by version 1
    assert [h["lag"] for h in ahead.history] == [0, 1, 2, 2]
    for k in range(1, 4):  # batch k was in flight before step k-1 began training
        assert ahead.generator[k][0] <= ahead.trainer[k - 1][0]
    assert ahead.checkpoint.startswith("tinker://")
    assert all(isinstance(h["loss"], float) for h in ahead.history)


def test_a_negative_lag_bound_is_refused_before_anything_is_opened() -> None:
    with pytest.raises(ValueError, match="max_off_policy must be 0"):
        async_rl.run(tinker, object(), "any", max_off_policy=-1)


def test_the_script_runs_from_a_folder_of_its_own(
    rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    out = tmp_path / "async.json"
    args = ["--steps", "3", "--prompts", "4", "--group", "4", "--max-off-policy", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "tgnb.tinker.async_rl", *args, "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["lag"] for r in rows if "lag" in r] == [0, 1, 1]
    saved = json.loads(out.read_text())
    assert saved["max_off_policy"] == 1 and len(saved["generator"]) == 3
    assert saved["checkpoint"].startswith("tinker://") and saved["steps_per_minute"] > 0
    assert rl_emulator.api_key not in proc.stdout + proc.stderr
    # its samplers, dropped unclosed, gave their sessions back before the exit report was made
    assert "held 2 model resource(s)" in proc.stderr and "still running" not in proc.stderr
