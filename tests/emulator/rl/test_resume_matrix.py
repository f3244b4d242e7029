"""Resuming a LoRA training checkpoint with any LoRA config, or none (issue 23 §2, issue 24 item 3).

Unmodified SDK against the real emulator daemon. Each way of resuming either trains on (the
checkpoint's LoRA config wins, a difference is said once in the session's metadata) or is a 400
naming the field; never a RUNNING session whose operations fail INTERNAL_ERROR (before the fix:
``KeyError: 's1_pub'``, from peft's `PeftModel.active_adapter` naming a deleted adapter once the last
adapters of a resource were removed). The matrix: the same config, none, another rank, another
alpha, a seed set in the source run, on a fresh resource (alone) and beside other sessions; and
stopping the last session of a resource then opening another.
"""

from __future__ import annotations

from typing import Any

import pytest
import together
from together.post_training import AdamParams, ModelResourcesClient, Sample

from tgnb.emulator.testing import EmulatorHandle

from .conftest import TINY

SAMPLES = [
    Sample(
        model_input={"chunks": [{"encoded_text": {"tokens": [1, 7, 8, 9, 10]}}]},
        loss_fn_inputs={"target_tokens": [7, 8, 9, 10, 11], "weights": [1.0] * 5},
    )
]
SOURCE = {"rank": 4, "alpha": 8, "seed": 7}


def _train(sess: Any, steps: int = 1) -> float:
    loss = 0.0
    for _ in range(steps):
        out = sess.trainer.forward_backward(samples=SAMPLES, loss={"type": "cross_entropy"})
        sess.trainer.optim_step(adam_params=AdamParams(learning_rate=0.005))
        loss = float(out.loss)
    return loss


def _logprobs(sess: Any) -> list[float]:
    out = sess.trainer.forward(samples=SAMPLES, loss={"type": "cross_entropy"})
    return list(out.loss_fn_outputs[0].tensors["logprobs"].data)


@pytest.fixture(scope="module")
def source(rl_daemon: EmulatorHandle) -> Any:
    """A training checkpoint at step 2 of a seeded rank-4 alpha-8 session, and its logprobs."""
    import os

    os.environ.setdefault("TOGETHER_DISABLE_VERSION_CHECK", "1")
    env = {"TOGETHER_BASE_URL": rl_daemon.base_url, "TOGETHER_API_KEY": rl_daemon.api_key}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        mr = ModelResourcesClient.create(base_model=TINY, interval=0.1)
        sess = mr.create_session(lora_config=SOURCE, interval=0.1)
        _train(sess, 2)
        ckpt = sess.create_training_checkpoint()
        at = _logprobs(sess)
        sess.stop()
        yield mr, ckpt.id, at
        mr.stop(force=True)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


CASES = {
    "same": dict(SOURCE),
    "none": None,
    "other-rank": {"rank": 16},
    "other-alpha": {"rank": 4, "alpha": 64},
    "other-seed": {"rank": 4, "alpha": 8, "seed": 99},
}


@pytest.mark.slow
@pytest.mark.parametrize("beside", [False, True], ids=["fresh-resource", "beside-others"])
@pytest.mark.parametrize("case", list(CASES))
def test_resume_any_lora_config(
    rl_emulator: EmulatorHandle, source: Any, case: str, beside: bool
) -> None:
    shared_mr, ckpt_id, at = source
    asked = CASES[case]
    mr = shared_mr if beside else ModelResourcesClient.create(base_model=TINY, interval=0.1)
    others = []
    try:
        if beside:  # two other sessions train on the same resource before and after
            others = [mr.create_session(lora_config={"rank": 2}, interval=0.1) for _ in range(2)]
            for o in others:
                _train(o)
        kwargs: dict[str, Any] = {"resume_from_checkpoint_id": ckpt_id, "interval": 0.1}
        if asked is not None:
            kwargs["lora_config"] = asked
        sess = mr.create_session(**kwargs)
        info = sess.retrieve()
        assert info.status == "TRAINING_SESSION_STATUS_RUNNING"
        assert str(info.step) == "2"
        assert info.lora_config.rank == 4 and info.lora_config.alpha == 8  # the checkpoint's
        note = info.metadata.to_dict().get("resume_lora_config", "")
        if case in ("other-rank", "other-alpha"):
            assert "was not used" in note and ckpt_id in note
            assert ("rank 16" if case == "other-rank" else "alpha 64") in note
        else:
            assert note == ""  # same, none or only another seed: nothing to say
        assert _logprobs(sess) == pytest.approx(at, abs=1e-6)
        before = _train(sess)
        after = _train(sess)
        assert after < before  # it really trains on
        for o in others:
            _train(o)  # and the other sessions still do
        sess.stop()
    finally:
        for o in others:
            o.stop()
        if not beside:
            mr.stop(force=True)


@pytest.mark.slow
def test_resume_with_bad_lora_config_is_400(rl_emulator: EmulatorHandle, source: Any) -> None:
    mr, ckpt_id, _ = source
    pt = together.Together(max_retries=0).post_training
    with pytest.raises(together.BadRequestError, match=r"lora_config\.rank"):
        pt.sessions.create(
            model_resources_id=mr.model_resources_id,
            resume_from_checkpoint_id=ckpt_id,
            lora_config={"rank": 0},
        )


@pytest.mark.slow
def test_stop_last_session_then_open_another(rl_emulator: EmulatorHandle) -> None:
    """Issue 24 item 3: the second session of a resource whose only session was stopped trains."""
    with ModelResourcesClient.create(base_model=TINY, interval=0.1) as mr:
        first = mr.create_session(lora_config={"rank": 4}, interval=0.1)
        _train(first)
        first.stop()
        for _ in range(2):  # and again, after that one is stopped too
            nxt = mr.create_session(lora_config={"rank": 4}, interval=0.1)
            before = _train(nxt)
            assert _train(nxt) < before
            nxt.stop()
