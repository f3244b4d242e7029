"""The reference's native end-to-end script, unmodified SDK against the real emulator daemon.

Only ``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY`` point the SDK at the emulator (the
``rl_emulator`` fixture); the model is the built-in tiny one, its prompts plain token lists.
"""

from __future__ import annotations

from pathlib import Path

from together import Together
from together.post_training import (
    AdamParams,
    ModelResourcesClient,
    Sample,
    SamplingParams,
    download_checkpoint,
)

from tgnb.emulator.testing import EmulatorHandle

from .conftest import TINY


def group_normalise(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    sd = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    return [(r - mean) / (sd + 1e-6) for r in rewards]


def test_native_flow_end_to_end(rl_emulator: EmulatorHandle, tmp_path: Path) -> None:
    prompts = [[1, 10, 11, 12], [1, 20, 21]]
    losses = []
    with (
        ModelResourcesClient.create(
            base_model=TINY,
            compute_config={"num_generator_replicas": 1},
            inactive_timeout=900,
            interval=0.2,
        ) as mr,
        mr.create_session(lora_config={"rank": 16, "alpha": 32}, interval=0.2) as sess,
    ):
        gen, tr = sess.generator, sess.trainer
        for _ in range(2):
            results = gen.sample_batch(
                [{"chunks": [{"encoded_text": {"tokens": p}}]} for p in prompts],
                num_samples=4,
                sampling_params=SamplingParams(max_tokens=8, temperature=1.0),
            )
            batch = []
            for p, res in zip(prompts, results, strict=False):
                comps = [[int(t) for t in s.tokens] for s in res.sequences]
                adv = group_normalise([float(sum(t % 2 for t in c)) for c in comps])
                for c, s, a in zip(comps, res.sequences, adv, strict=False):
                    full, pad = p + c, [0.0] * (len(p) - 1)
                    batch.append(
                        Sample(
                            model_input={"chunks": [{"encoded_text": {"tokens": full[:-1]}}]},
                            loss_fn_inputs={
                                "target_tokens": full[1:],
                                "logprobs": pad + list(s.logprobs),
                                "advantages": pad + [a] * len(c),
                                "mask": [0] * len(pad) + [1] * len(c),
                            },
                        )
                    )
            fb = tr.forward_backward(
                samples=batch,
                loss={
                    "type": "grpo",
                    "grpo_params": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
                },
            )
            losses.append(fb.loss)
            tr.optim_step(adam_params=AdamParams(learning_rate=1e-3))
            tr.weights_sync()
        tck = sess.create_training_checkpoint()
        ick = sess.create_inference_checkpoint()
        state = sess.retrieve()
        assert str(state.step) == "2"
        assert str(state.policy_state.applied_weights_version) == "2"
        assert [c.id for c in state.training_checkpoints] == [tck.id]
        assert [c.id for c in state.inference_checkpoints] == [ick.id]
    assert len(losses) == 2
    client = Together()
    info = client.post_training.checkpoints.retrieve(tck.id)
    assert (info.type, info.lora_rank, str(info.step)) == ("CHECKPOINT_TYPE_TRAINING", 16, "2")
    listed = client.post_training.checkpoints.list(session_id=state.id).data
    assert {c.id for c in listed} == {tck.id, ick.id}

    files = download_checkpoint(
        client, ick.id, variant="CHECKPOINT_VARIANT_ADAPTER", output_dir=tmp_path / "adapter"
    )
    names = {f.name for f in files}
    assert {"adapter_model.safetensors", "adapter_config.json"} <= names
    assert all(f.stat().st_size > 0 for f in files)
    merged = download_checkpoint(client, ick.id, output_dir=tmp_path / "merged")
    assert "model.safetensors" in {f.name for f in merged}

    log = rl_emulator.requests()
    ops = [e for e in log if "/operations/" in e["path"] and e["method"] == "POST"]
    assert ops and all(e["status"] == 200 for e in ops)
    # every operation finished inside its POST: the SDK never had to poll
    assert not [e for e in log if "/operations/" in e["path"] and e["method"] == "GET"]
    assert all(e["status"] != 500 for e in log)
