"""The asynchronous RL recipe (`tgnb.tinker.async_rl`) against the real emulator daemon over HTTP,
through ``tgnb.tinker``: the synchronous loop never has rollouts in flight while it trains; the
asynchronous one trains each batch one policy version after the sampler that drew it (at most
`max_off_policy`), with the next batch already submitted while the trainer works; the script runs
from a folder of its own and writes its history, timeline and final checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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


BAD_OPTIONS = [
    (["--steps", "0"], "--steps must be 1 or more, not 0"),
    (["--steps", "two"], "argument --steps: invalid int value: 'two'"),
    (["--group", "0"], "--group must be 1 or more, not 0"),
    (["--max-off-policy", "-1"], "--max-off-policy must be 0 (synchronous) or more"),
    (["--lr", "-0.1"], "--lr must be a finite number above 0"),
    (["--loss", "gspo"], "argument --loss: invalid choice: 'gspo'"),
    (["--model", "no/such-model"], "--model 'no/such-model' is not a model the service lists"),
    (["--rank", "100000"], "--rank 100000 is above"),
    (["--prompts", "64", "--group", "64"], "--prompts x --group is 4096 datums a step"),
    (["--max-tokens", "1000000"], "leaves no room for the prompt"),
    (["--out", "no-such-folder/async.json"], "is not a folder this process can write in"),
]


def _refused(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tgnb.tinker.async_rl", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard: under load, four of these share the cores
        env=env,
    )


def test_bad_options_are_one_line_and_exit_2_with_nothing_provisioned(
    rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    import together

    def resources() -> set[str]:
        return {r.id for r in together.Together().post_training.model_resources.list().data}

    # the service's own settings: a key it refuses, a URL nothing answers at
    bad_env = [
        ({"TOGETHER_API_KEY": "not-this-services-key"}, "the service refused the API key"),
        ({"TOGETHER_BASE_URL": "http://127.0.0.1:9"}, "cannot reach the service at"),
    ]
    before = resources()
    # each case is a process of its own, most of whose seconds go to importing tgnb.tinker (and
    # with it torch): they run side by side, each judged on its own as before
    with ThreadPoolExecutor(max_workers=4) as pool:
        by_option = [pool.submit(_refused, args, tmp_path) for args, _ in BAD_OPTIONS]
        by_env = [
            pool.submit(_refused, ["--steps", "1"], tmp_path, {**os.environ, **env})
            for env, _ in bad_env
        ]
        for (args, says), future in zip(BAD_OPTIONS, by_option, strict=True):
            proc = future.result()
            assert proc.returncode == 2, (args, proc.stderr[-2000:])
            assert proc.stdout == "" and proc.stderr.count("\n") == 1, (args, proc.stderr)
            assert proc.stderr.startswith("python -m tgnb.tinker.async_rl: ")
            assert says in proc.stderr, (args, proc.stderr)
        for (env, says), future in zip(bad_env, by_env, strict=True):
            proc = future.result()
            assert proc.returncode == 2 and proc.stderr.count("\n") == 1, (env, proc.stderr[-2000:])
            assert says in proc.stderr and proc.stdout == "", (env, proc.stderr)
    assert resources() == before  # nothing was provisioned


def test_bad_settings_are_refused_before_the_service_is_touched() -> None:
    for bad, says in [
        ({"steps": 0}, "steps must be 1 or more"),
        ({"prompts_per_step": 2.5}, "prompts_per_step must be an integer"),
        ({"learning_rate": float("inf")}, "learning_rate must be a finite number"),
        ({"loss": "cross_entropy"}, "loss must be one of importance_sampling, ppo"),
    ]:
        with pytest.raises(async_rl.SettingError, match=says):
            async_rl.run(tinker, object(), "any", **bad)  # object(): any use would fail


def test_the_model_schedules_the_loop_on_two_gpus() -> None:
    """Each step: a batch samples 2 s on the sampler's GPU, training 1 s, saving and opening the
    sampler 0.5 s each. Synchronous: 4 s a step. One version ahead: the trainer's 2 s a step run
    beside the next batch's 2 s, so a step takes 2 s once the pipeline is full."""
    pieces = async_rl.PieceSeconds(
        sampling=[2.0] * 4, rewards=[0.0] * 4, training=[1.0] * 4, saving=[0.5] * 4,
        opening=[0.5] * 4,
    )  # fmt: skip
    assert async_rl.modelled_seconds(pieces, 0) == [4.0, 8.0, 12.0, 16.0]
    assert async_rl.modelled_seconds(pieces, 1) == [4.0, 6.0, 8.0, 10.0]
    assert async_rl.modelled_steps_per_minute(pieces, 0) == 15.0
    assert async_rl.modelled_steps_per_minute(pieces, 1) == 30.0
    # a sampler slower than the trainer bounds the pace: 3 s a batch, however far ahead; each
    # sampler is ready once the batch in flight is done
    slow = async_rl.PieceSeconds(**{**vars(pieces), "sampling": [3.0] * 4})
    assert async_rl.modelled_seconds(slow, 2) == [6.0, 9.0, 12.0, 14.0]


def test_the_model_replays_a_synchronous_run(rl_emulator: EmulatorHandle) -> None:
    with tinker.ServiceClient() as service:
        sync = async_rl.run(tinker, service, base_model(service), max_off_policy=0, **SMALL)
    pieces = async_rl.PieceSeconds.of(sync)
    assert len(pieces.sampling) == len(pieces.opening) == 4
    assert min(min(v) for v in vars(pieces).values()) >= 0.0
    modelled = async_rl.modelled_steps_per_minute(pieces, 0)
    assert modelled == pytest.approx(sync.steps_per_minute, rel=0.05)  # the same run, replayed
    assert async_rl.modelled_steps_per_minute(pieces, 1) > modelled
