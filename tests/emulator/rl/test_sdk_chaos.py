"""Chaos at 30 % (429, 503, and responses lost after the request was applied) with the SDK's own
retries: a short training loop completes and every operation is applied exactly once."""

from __future__ import annotations

import random

from together.post_training import AdamParams, ModelResourcesClient, Sample, SamplingParams

from tgnb.emulator.testing import EmulatorHandle

from .conftest import TINY


def _batch(seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(4):
        toks = [rng.randrange(3, 100) for _ in range(12)]
        out.append(
            Sample(
                model_input={"chunks": [{"encoded_text": {"tokens": toks[:-1]}}]},
                loss_fn_inputs={"target_tokens": toks[1:], "weights": [1.0] * 11},
            )
        )
    return out


def _train(sess: object, steps: int) -> None:
    tr, gen = sess.trainer, sess.generator  # type: ignore[attr-defined]
    for step in range(steps):
        gen.sample(
            {"chunks": [{"encoded_text": {"tokens": [1, 5, 6]}}]},
            num_samples=2,
            sampling_params=SamplingParams(max_tokens=4, seed=step),
        )
        tr.forward_backward(samples=_batch(step), loss={"type": "cross_entropy"})
        tr.forward_backward(samples=_batch(100 + step), loss={"type": "cross_entropy"})
        tr.optim_step(adam_params=AdamParams(learning_rate=0.02))
        tr.weights_sync()


def _logprobs(sess: object) -> list[float]:
    out = sess.trainer.forward(samples=_batch(999), loss={"type": "cross_entropy"})  # type: ignore[attr-defined]
    return [x for o in out.loss_fn_outputs for x in o.tensors["logprobs"].data]


def test_training_through_chaos_applies_each_operation_once(rl_emulator: EmulatorHandle) -> None:
    steps = 4
    with ModelResourcesClient.create(base_model=TINY, interval=0.1) as mr:
        mr.create_session(lora_config={"rank": 4}, interval=0.1)  # the first adapter (unused)
        calm = mr.create_session(lora_config={"rank": 4, "seed": 3}, interval=0.1)
        stormy = mr.create_session(lora_config={"rank": 4, "seed": 3}, interval=0.1)
        _train(calm, steps)
        rl_emulator.clear_requests()
        rl_emulator.set_chaos(0.3, seed=11, kinds=("429", "503", "lost"), retry_after_ms=10)
        _train(stormy, steps)
        ckpt = stormy.create_training_checkpoint()
        rl_emulator.set_chaos(0.0)
        log = rl_emulator.requests()
        lost = [e for e in log if e["chaos"] == "lost" and "/operations/" in e["path"]]
        assert lost, "the seeded chaos lost no operation response: pick another seed"
        assert sum(e["chaos"] is not None for e in log) > 0.15 * len(log)
        state = stormy.retrieve()
        assert str(state.step) == str(steps)
        assert str(state.policy_state.applied_weights_version) == str(steps)
        assert [c.id for c in state.training_checkpoints] == [ckpt.id]
        assert _logprobs(stormy) == _logprobs(calm)
        mr.stop(force=True)
