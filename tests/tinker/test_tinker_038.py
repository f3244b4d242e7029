"""Tinker 0.38's surface on the layer, with tinker 0.38 installed (skipped with an older one):
the calls a tinker 0.38 user writes that Post-Training has no primitive for, each served on the
client or refused with one line, against the emulator's Post-Training API; and a walk over the
genuine package's public members (clients, ``APIFuture``, ``tinker.types``)."""

from __future__ import annotations

import concurrent.futures
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tgnb.emulator.testing import EmulatorHandle

genuine = pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # noqa: E402
from tgnb.tinker._compat import TINKER_VERSION  # noqa: E402
from tgnb.tinker._metadata import metadata_of  # noqa: E402
from tgnb.tinker._offloop import OffLoopFuture  # noqa: E402

pytestmark = pytest.mark.skipif(
    TINKER_VERSION < (0, 38), reason=f"needs tinker >= 0.38, installed {genuine.__version__}"
)
types = tinker.types
MODEL = "tgnb/tiny-llama"
PROMPT = [1, 45, 49, 73, 70]


def _rl_datum(prompt: list[int], sampled: list[int], q: list[float], adv: float) -> Any:
    """An RL datum as the cookbook's rl_loop builds one for ``gspo``."""
    tokens = prompt + sampled
    n = len(prompt)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * (n - 1) + list(q),
            "advantages": [0.0] * (n - 1) + [adv] * len(sampled),
            "sequence_ratio_mask": [0.0] * (n - 1) + [1.0] * len(sampled),
        },
    )


def _logprobs(client: Any, data: list[Any]) -> list[np.ndarray]:
    """The trainer's per-token logprobs of `data`'s targets (a cross-entropy forward)."""
    scored = [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                "target_tokens": d.loss_fn_inputs["target_tokens"],
                "weights": [1.0] * d.model_input.length,
            },
        )
        for d in data
    ]
    out = client.forward(scored, "cross_entropy").result()
    return [np.asarray(o["logprobs"].tolist()) for o in out.loss_fn_outputs]


@pytest.mark.slow
def test_the_nine_calls_of_a_tinker_038_user(
    rl_emulator: EmulatorHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TGNB_HOME", str(tmp_path))
    with pytest.raises(NotImplementedError, match=r"project_id=.p.*take no project"):
        tinker.ServiceClient(project_id="p")
    service = tinker.ServiceClient()
    assert service.get_console_url() == f"{rl_emulator.base_url.rstrip('/')}/v1/rl/model-resources"
    with pytest.raises(NotImplementedError, match="AdamW only"):
        service.create_lora_training_client(MODEL, optimizer=types.DimuonOptimizerConfig())
    client = service.create_lora_training_client(
        MODEL, rank=8, seed=0, optimizer=types.AdamOptimizerConfig()
    )
    try:
        session_id = client._session.session_id
        assert client.get_console_url().endswith(f"/v1/rl/training-sessions/{session_id}")

        # Datum(model_input_spans=...) trains (the spans are Tinker's provenance: not sent)
        tokens = [*PROMPT, 63, 24]
        spanned = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
            model_input_spans=[types.PromptProvenanceSpan(sequence_id="s", length=6)],
            loss_fn_input_spans=[types.PromptProvenanceSpan(sequence_id="s", offset=1, length=6)],
        )
        # APIFuture.future(): a concurrent.futures.Future, usable with wait()
        future = client.forward_backward([spanned], "cross_entropy")
        assert isinstance(future, OffLoopFuture)
        done, _ = concurrent.futures.wait([future.future()], timeout=120)
        assert len(done) == 1
        assert future.future().result().metrics["loss:sum"] > 0
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()

        # sample(topk_sample_logprobs=): each sampled position's top-k, the sampled token's own
        # logprob among them when it is in the top k, and never above the top-1
        sampler = client.save_weights_and_get_sampling_client(kind="inflight")
        with pytest.raises(ValueError, match="kind must be one of"):
            client.save_weights_and_get_sampling_client(kind="nope")
        prompt = types.ModelInput.from_ints(PROMPT)
        params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
        result = sampler.sample(prompt, 2, params, topk_sample_logprobs=3).result()
        for seq in result.sequences:
            assert seq.sequence_id is None
            assert len(seq.topk_logprobs) == len(seq.tokens) > 0
            for token, logprob, row in zip(
                seq.tokens, seq.logprobs, seq.topk_logprobs, strict=True
            ):
                assert len(row) == 3
                assert row[0][1] >= logprob - 1e-3
                listed = dict(row)
                if token in listed:
                    assert listed[token] == pytest.approx(logprob, abs=1e-3)

        # prompt_logprobs_last_n, on sample and compute_logprobs
        full = sampler.compute_logprobs(prompt).result()
        last = sampler.compute_logprobs(prompt, prompt_logprobs_last_n=2).result()
        assert last[:-2] == [None] * (len(PROMPT) - 2)
        assert last[-2:] == pytest.approx(full[-2:], abs=1e-5)
        sampled = sampler.sample(
            prompt, 1, params, include_prompt_logprobs=True, prompt_logprobs_last_n=2
        ).result()
        assert sampled.prompt_logprobs[:-2] == [None] * (len(PROMPT) - 2)
        assert sampled.prompt_logprobs[-2:] == pytest.approx(full[-2:], abs=1e-4)
        with pytest.raises(ValueError, match="between 1 and len"):
            sampler.compute_logprobs(prompt, prompt_logprobs_last_n=len(PROMPT))
        with pytest.raises(NotImplementedError, match="prompt_alt_tokens_k"):
            sampler.sample(prompt, 1, params, prompt_alt_tokens_k=2)

        # save_state(user_metadata=): kept with the checkpoint's id, read back by its path
        saved = client.save_state("meta", user_metadata={"step": "1", "run": "a"}).result()
        assert metadata_of(client._conn, saved.path) == {"run": "a", "step": "1"}
        plain = client.save_state("plain").result()
        assert metadata_of(client._conn, plain.path) is None

        # stable_reinforce: one line saying what Post-Training lacks
        data = [_rl_datum(PROMPT, [63, 24], [-1.0, -1.0], 1.0)]
        with pytest.raises(NotImplementedError, match=r"stable_reinforce.*does not record"):
            client.forward_backward(data, "stable_reinforce")
    finally:
        service.close()


@pytest.mark.slow
def test_gspo_is_tinkers_objective_over_the_service_forward_backward(
    rl_emulator: EmulatorHandle,
) -> None:
    """On-policy (the sampling logprobs are the trainer's own), GSPO's sequence ratio is 1, so
    its gradient is importance sampling's: two clients of the same seed, one trained with each,
    end at the same logprobs. Off-policy past the clip, its gradient is 0: the weights stay."""
    service = tinker.ServiceClient()
    a, b, c = (service.create_lora_training_client(MODEL, rank=8, seed=5) for _ in range(3))
    try:
        sampled = [[63, 24, 38], [81, 29, 13]]
        advantages = [1.0, -0.5]
        probe = [_rl_datum(PROMPT, s, [0.0] * len(s), 0.0) for s in sampled]
        n = len(PROMPT) - 1
        start = _logprobs(a, probe)
        for other in (b, c):
            same = zip(start, _logprobs(other, probe), strict=True)
            assert all(np.allclose(x, y, atol=1e-5) for x, y in same)
        data = [
            _rl_datum(PROMPT, s, list(lp[n:]), adv)
            for s, lp, adv in zip(sampled, start, advantages, strict=True)
        ]
        out = a.forward_backward(data, "gspo").result()
        assert out.metrics["loss:sum"] == pytest.approx(-sum(3 * adv for adv in advantages), 1e-3)
        is_data = [
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={
                    k: v for k, v in d.loss_fn_inputs.items() if k != "sequence_ratio_mask"
                },
            )
            for d in data
        ]
        b.forward_backward(is_data, "importance_sampling").result()
        for client in (a, b):
            client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        after_a, after_b = _logprobs(a, probe), _logprobs(b, probe)
        assert not np.allclose(after_a[0], start[0], atol=1e-3)  # it trained
        assert all(np.allclose(x, y, atol=1e-4) for x, y in zip(after_a, after_b, strict=True))

        # sampled at logprobs 0.5 below the trainer's: ratio e^0.5 > 1.2, positive advantage:
        # the clipped term is the minimum, the loss is -1.2 * sum(A), and the gradient 0 (a
        # fresh client's first Adam step on it moves nothing)
        stale = [
            _rl_datum(PROMPT, s, list(lp[n:] - 0.5), 1.0)
            for s, lp in zip(sampled, start, strict=True)
        ]
        forward_only = c.forward(stale, "gspo").result()
        assert forward_only.metrics["loss:sum"] == pytest.approx(-1.2 * 6, rel=1e-4)
        assert forward_only.metrics["gspo/clipped_fraction"] == 1.0
        out = c.forward_backward(stale, "gspo").result()
        assert out.metrics["loss:sum"] == pytest.approx(-1.2 * 6, rel=1e-4)
        c.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        unmoved = zip(_logprobs(c, probe), start, strict=True)
        assert all(np.allclose(x, y, atol=1e-5) for x, y in unmoved)
        with pytest.raises(ValueError, match="sequence_ratio_mask"):
            a.forward_backward(is_data, "gspo")
    finally:
        service.close()


# -- the public surface -----------------------------------------------------------------------
CLIENTS = [
    (genuine.ServiceClient, tinker.ServiceClient),
    (genuine.TrainingClient, tinker.TrainingClient),
    (genuine.SamplingClient, tinker.SamplingClient),
    (genuine.APIFuture, OffLoopFuture),
]

#: Members refused when called, with the arguments to call them with (no service is reached).
REFUSED: dict[tuple[str, str], tuple[tuple[Any, ...], dict[str, Any]]] = {
    ("ServiceClient", "copy_weights"): (("tinker://r/weights/c",), {}),
    ("ServiceClient", "create_custom_loss"): ((lambda d, lp: None, {}), {}),
    ("SamplingClient", "create"): ((None,), {}),
    ("SamplingClient", "from_sampler_handle"): (("h",), {}),
    ("SamplingClient", "get_sampler_handle"): ((), {}),
}


def _public(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_"))


@pytest.mark.parametrize(("theirs", "ours"), CLIENTS, ids=lambda c: c.__name__)
def test_every_public_member_of_tinker_038_is_here_with_its_parameters(
    theirs: type, ours: type
) -> None:
    for name in _public(theirs):
        assert name in dir(ours), f"{theirs.__name__}.{name} is missing"
        member = inspect.getattr_static(theirs, name)
        if not callable(member) and not isinstance(member, (classmethod, staticmethod)):
            continue
        want = inspect.signature(getattr(theirs, name)).parameters
        have = inspect.signature(getattr(ours, name)).parameters
        if any(p.kind is p.VAR_KEYWORD for p in have.values()):
            continue
        lacking = [p for p in want if p not in have and want[p].kind is not p.VAR_KEYWORD]
        assert not lacking, f"{theirs.__name__}.{name} takes no {lacking}"


def test_members_post_training_lacks_are_refused_in_one_line() -> None:
    sampler = object.__new__(tinker.SamplingClient)
    service = object.__new__(tinker.ServiceClient)
    owners = {"ServiceClient": service, "SamplingClient": sampler}
    for (owner, name), (args, kwargs) in REFUSED.items():
        with pytest.raises(NotImplementedError) as caught:
            getattr(owners[owner], name)(*args, **kwargs)
        assert "\n" not in str(caught.value) and "Post-Training" in str(caught.value), name
    with pytest.raises(NotImplementedError, match="internal connection"):
        _ = service.holder


def test_every_type_and_name_of_tinker_038_is_answered() -> None:
    for name in _public(genuine.types):
        assert getattr(tinker.types, name) is getattr(genuine.types, name)
    names = [n for n in _public(genuine) if n != "AdminClient"]  # Tinker's own service's admin
    missing = [n for n in names if not hasattr(tinker, n)]
    assert not missing
    assert tinker.Datum is genuine.types.Datum
    assert tinker.ServiceClient is not genuine.ServiceClient
