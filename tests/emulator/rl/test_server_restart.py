"""Kill the daemon (SIGKILL) mid-session and start it again: what the user had is there, as the
module docstring of `tgnb.emulator.rl.lifecycle` documents. A session with a training checkpoint
resumes from it (step and weights as saved, said in its metadata); one without goes to ERROR
SESSION_FAILED; checkpoints stay downloadable; another project's checkpoint is refused."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import together
from together.post_training import AdamParams, ModelResourcesClient, Sample, SessionClient

from tests.conftest import wait_until
from tgnb.emulator.testing import running_emulator

from .conftest import TINY

SAMPLES = [
    Sample(
        model_input={"chunks": [{"encoded_text": {"tokens": [1, 7, 8, 9, 10]}}]},
        loss_fn_inputs={"target_tokens": [7, 8, 9, 10, 11], "weights": [1.0] * 5},
    )
]


def _step(tr: object) -> None:
    tr.forward_backward(samples=SAMPLES, loss={"type": "cross_entropy"})  # type: ignore[attr-defined]
    tr.optim_step(adam_params=AdamParams(learning_rate=0.02))  # type: ignore[attr-defined]


def _logprobs(tr: object) -> list[float]:
    out = tr.forward(samples=SAMPLES, loss={"type": "cross_entropy"})  # type: ignore[attr-defined]
    return list(out.loss_fn_outputs[0].tensors["logprobs"].data)


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_and_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "tgnb-test-restart-key"
    monkeypatch.setenv("TOGETHER_API_KEY", key)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with running_emulator(tmp_path, time_scale=0.01, api_key=key) as emu:
        monkeypatch.setenv("TOGETHER_BASE_URL", emu.base_url)
        mr = ModelResourcesClient.create(base_model=TINY, interval=0.1)
        saved = mr.create_session(lora_config={"rank": 4}, interval=0.1)
        lost = mr.create_session(lora_config={"rank": 4}, interval=0.1)
        _step(saved.trainer)
        ckpt = saved.create_training_checkpoint()
        at_checkpoint = _logprobs(saved.trainer)
        _step(saved.trainer)  # after the checkpoint: lost with the daemon
        _step(lost.trainer)
        _kill(emu.pid)
    with running_emulator(tmp_path, time_scale=0.01, api_key=key) as emu:
        monkeypatch.setenv("TOGETHER_BASE_URL", emu.base_url)
        client = together.Together()
        pt = client.post_training
        assert pt.model_resources.retrieve(mr.model_resources_id).status.endswith("READY")
        wait_until(lambda: pt.sessions.retrieve(saved.session_id).status.endswith("RUNNING"))
        again = pt.sessions.retrieve(saved.session_id)
        assert str(again.step) == "1"
        assert ckpt.id in again.metadata.to_dict()["emulator_restart"]
        failed = pt.sessions.retrieve(lost.session_id)
        assert failed.status == "TRAINING_SESSION_STATUS_ERROR"
        assert failed.error.code == "TRAINING_SESSION_ERROR_CODE_SESSION_FAILED"
        assert "checkpoint" in failed.error.message
        assert pt.checkpoints.retrieve(ckpt.id).session_id == saved.session_id
        sess = SessionClient.attach(session_id=saved.session_id)
        assert _logprobs(sess.trainer) == pytest.approx(at_checkpoint, abs=1e-6)
        _step(sess.trainer)
        assert str(sess.retrieve().step) == "2"
        pt.model_resources.stop(mr.model_resources_id, force=True)
    with running_emulator(tmp_path, time_scale=0.01, api_key=key, project_id="proj_other") as emu:
        monkeypatch.setenv("TOGETHER_BASE_URL", emu.base_url)
        pt = together.Together(max_retries=0).post_training
        with pytest.raises(together.NotFoundError):
            pt.checkpoints.retrieve(ckpt.id)
        with pytest.raises(together.NotFoundError):
            pt.model_resources.retrieve(mr.model_resources_id)
        with (
            ModelResourcesClient.create(base_model=TINY, interval=0.1) as other,
            pytest.raises(together.BadRequestError, match="resume_from_checkpoint_id"),
        ):
            pt.sessions.create(
                model_resources_id=other.model_resources_id,
                resume_from_checkpoint_id=ckpt.id,
            )
