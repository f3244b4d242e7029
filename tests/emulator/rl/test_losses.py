"""Each built-in loss against an independent per-token computation (plain Python over the model's
own logprobs), the client-gradient path against autograd, and the refusals of bad inputs.

Real computation: the tiny Llama with a peft LoRA adapter in torch on the CPU (nothing faked)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from tgnb.emulator.rl.catalog import resolve
from tgnb.emulator.rl.engine import ResourceHost, RLInputError

LENGTHS = (7, 4, 9)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResourceHost]:
    root = tmp_path_factory.mktemp("losses")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("TGNB_HOME", str(root / "tgnb"))
        h = ResourceHost(resolve("tgnb/tiny-llama"), lora_enabled=True, device="cpu")
        h.open_session("s", {"rank": 4, "alpha": 8, "seed": 0})
        # move the adapter off its zero init so ratios differ from 1
        body = {
            "loss": {"type": "LOSS_TYPE_CROSS_ENTROPY"},
            "samples": [ce(n, i) for i, n in enumerate(LENGTHS)],
        }
        h.forward_backward("s", body)
        h.optim_step("s", {"adam_params": {"learning_rate": 0.05}})
        yield h


def mi(tokens: list[int]) -> dict[str, Any]:
    return {"chunks": [{"encoded_text": {"tokens": tokens}}]}


def f32(xs: list[float]) -> dict[str, Any]:
    return {"data": xs, "dtype": "float32"}


def i64(xs: list[int]) -> dict[str, Any]:
    return {"data": xs, "dtype": "int64"}


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, 100) for _ in range(n + 1)]


def ce(n: int, seed: int, weights: list[float] | None = None) -> dict[str, Any]:
    t = tokens(n, seed)
    w = weights if weights is not None else [1.0] * n
    return {
        "model_input": mi(t[:-1]),
        "loss_fn_inputs": {"target_tokens": i64(t[1:]), "weights": f32(w)},
    }


def policy_batch(
    seed: int = 1, *, ref: bool = False, sel: str | None = "mask"
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i, n in enumerate(LENGTHS):
        t = tokens(n, i)
        inputs = {
            "target_tokens": i64(t[1:]),
            "logprobs": f32([-4.6 + rng.uniform(-0.6, 0.6) for _ in range(n)]),
            "advantages": f32([rng.choice([-1.5, -0.5, 0.7, 2.0]) for _ in range(n)]),
        }
        if sel == "mask":
            inputs["mask"] = i64([0] * 2 + [1] * (n - 2))
        elif sel == "weights":
            inputs["weights"] = f32([0.0] + [0.5] * (n - 1))  # policy losses: non-zero counts as 1
        if ref:
            inputs["reference_logprobs"] = f32([-4.6 + rng.uniform(-0.3, 0.3) for _ in range(n)])
        out.append({"model_input": mi(t[:-1]), "loss_fn_inputs": inputs})
    return out


def model_logprobs(host: ResourceHost, samples: list[dict[str, Any]]) -> list[list[float]]:
    """The current policy's per-token logprobs (a forward with unit weights)."""
    plain = [
        {
            "model_input": s["model_input"],
            "loss_fn_inputs": {
                "target_tokens": s["loss_fn_inputs"]["target_tokens"],
                "weights": f32([1.0] * len(s["loss_fn_inputs"]["target_tokens"]["data"])),
            },
        }
        for s in samples
    ]
    out = host.forward_backward(
        "s",
        {
            "loss": {"type": "cross_entropy"},
            "samples": plain,
            "forward_only": True,
            "return_loss_fn_outputs": True,
        },
    )
    return [o["tensors"]["logprobs"]["data"] for o in out["loss_fn_outputs"]]


def rows(samples: list[dict[str, Any]], lp: list[list[float]]) -> Iterator[list[tuple[float, ...]]]:
    """Per sample, per token: (logp, q, A, m, ref)."""
    for s, logp in zip(samples, lp, strict=True):
        x = s["loss_fn_inputs"]
        sel = x.get("mask", x.get("weights"))
        m = [1.0 if v != 0 else 0.0 for v in sel["data"]] if sel else [1.0] * len(logp)
        ref = x.get("reference_logprobs", {"data": [0.0] * len(logp)})["data"]
        yield list(zip(logp, x["logprobs"]["data"], x["advantages"]["data"], m, ref, strict=True))


def clip(r: float, lo: float, hi: float) -> float:
    return min(max(r, lo), hi)


def expected(kind: str, samples: list[dict[str, Any]], lp: list[list[float]], **p: Any) -> float:
    total, count, seqs, horizon = 0.0, 0.0, [], max(len(x) for x in lp)
    for row in rows(samples, lp):
        seq_mean = sum(m * (lp_ - q) for lp_, q, _, m, _ in row) / max(
            1.0, sum(m for *_, m, _ in row)
        )
        s_sum, s_n = 0.0, 0.0
        for logp, q, a, m, ref in row:
            r = math.exp(logp - q)
            if kind == "is":
                term = -r * a
            elif kind == "ppo":
                term = -min(r * a, clip(r, 0.8, 1.2) * a)
            elif kind == "cispo":
                term = -clip(r, 0.8, 1.2) * logp * a
            elif kind == "dro":
                term = -(logp * a - 0.5 * p["beta"] * (logp - q) ** 2)
            elif kind == "dppo":
                term = -r * a  # the value is r*A whether or not the token is blocked
            else:  # grpo
                rr = math.exp(seq_mean) if p.get("seq") else r
                term = -min(rr * a, clip(rr, p["lo"], p["hi"]) * a)
                if p.get("beta"):
                    d = ref - logp
                    term += p["beta"] * (math.exp(d) - d - 1)
            total += m * term
            count += m
            s_sum += m * term
            s_n += m
        if s_n:
            seqs.append(s_sum / s_n)
    if kind != "grpo":
        return total
    agg = p.get("agg", "token")
    if agg == "token":
        return total / count
    if agg == "seq":
        return sum(seqs) / len(seqs)
    return total / (len(lp) * horizon)


CASES = [
    ("is", {"type": "LOSS_TYPE_IMPORTANCE_SAMPLING"}, {}),
    ("ppo", {"type": "ppo"}, {}),
    ("cispo", {"type": "LOSS_TYPE_CISPO", "cispo_params": {}}, {}),
    ("dro", {"type": "LOSS_TYPE_DRO", "dro_params": {"beta": 0.3}}, {"beta": 0.3}),
    ("dppo", {"type": "LOSS_TYPE_DPPO", "dppo_params": {"delta_low": 0.01, "delta_high": 0.01}}, {}),
    ("grpo", {"type": "grpo", "grpo_params": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}},
     {"lo": 0.9, "hi": 1.1}),
    ("grpo", {"type": "grpo", "grpo_params": {"agg_type": "GRPO_LOSS_AGGREGATION_TYPE_SEQUENCE_MEAN"}},
     {"lo": 0.8, "hi": 1.2, "agg": "seq"}),
    ("grpo", {"type": "grpo", "grpo_params": {"agg_type": "GRPO_LOSS_AGGREGATION_TYPE_FIXED_HORIZON",
                                              "ratio_type": "GRPO_LOSS_RATIO_TYPE_SEQUENCE"}},
     {"lo": 0.8, "hi": 1.2, "agg": "fixed", "seq": True}),
    ("grpo", {"type": "grpo", "grpo_params": {"beta": 0.2}}, {"lo": 0.8, "hi": 1.2, "beta": 0.2}),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "loss", "params"), CASES)
@pytest.mark.parametrize("sel", ["mask", "weights", None])
def test_policy_losses_match_an_independent_computation(
    host: ResourceHost, kind: str, loss: dict[str, Any], params: dict[str, Any], sel: str | None
) -> None:
    samples = policy_batch(ref=bool(params.get("beta")) and kind == "grpo", sel=sel)
    lp = model_logprobs(host, samples)
    out = host.forward_backward(
        "s",
        {"loss": loss, "samples": samples, "forward_only": True, "return_loss_fn_outputs": True},
    )
    want = expected(kind, samples, lp, **params)
    assert out["loss"] == pytest.approx(want, rel=1e-5, abs=1e-5)
    assert out["metrics"]["loss:sum"] == out["loss"]
    for o, s, logp in zip(out["loss_fn_outputs"], samples, lp, strict=True):
        x = s["loss_fn_inputs"]
        sel_t = x.get("mask", x.get("weights"))
        m = [v != 0 for v in sel_t["data"]] if sel_t else [True] * len(logp)
        assert o["tensors"]["logprobs"]["data"] == pytest.approx(
            [v if k else 0.0 for v, k in zip(logp, m, strict=False)]
        )


def test_cross_entropy_honours_fractional_weights(host: ResourceHost) -> None:
    samples = [ce(n, i, [0.0, 0.25] + [1.0] * (n - 2)) for i, n in enumerate(LENGTHS)]
    lp = model_logprobs(host, samples)
    out = host.forward_backward(
        "s", {"loss": {"type": "cross_entropy"}, "samples": samples, "forward_only": True}
    )
    want = -sum(
        w * x
        for s, row in zip(samples, lp, strict=False)
        for w, x in zip(s["loss_fn_inputs"]["weights"]["data"], row, strict=False)
    )
    assert out["loss"] == pytest.approx(want, rel=1e-6)
    assert "loss_fn_outputs" not in out  # only when asked


def grads(host: ResourceHost) -> list[Any]:
    return [p.grad.clone() for p in host.sessions["s"].params]


def zero(host: ResourceHost) -> None:
    for p in host.sessions["s"].params:
        p.grad = None


def test_custom_gradients_equal_autograd_of_the_same_loss(host: ResourceHost) -> None:
    """IS loss by autograd == custom forward-backward with g = dL/dlogp = -m*r*A."""
    samples = policy_batch(seed=3)
    lp = model_logprobs(host, samples)
    zero(host)
    host.forward_backward("s", {"loss": {"type": "importance_sampling"}, "samples": samples})
    auto = grads(host)
    zero(host)
    gradients = [
        f32([-m * math.exp(x - q) * a for x, q, a, m, _ in row]) for row in rows(samples, lp)
    ]
    plain = [{"model_input": s["model_input"], "loss_fn_inputs": {
        "target_tokens": s["loss_fn_inputs"]["target_tokens"],
        "weights": f32([0.0] * len(s["loss_fn_inputs"]["target_tokens"]["data"]))}} for s in samples]  # fmt: skip
    assert host.custom_forward_backward("s", {"samples": plain, "gradients": gradients}) == {}
    custom = grads(host)
    zero(host)
    assert any(bool(a.abs().sum() > 0) for a in auto)
    for a, c in zip(auto, custom, strict=True):
        assert bool((a - c).abs().max() <= 1e-5 + 1e-4 * a.abs().max())


def test_forward_only_leaves_gradients_and_backward_accumulates(host: ResourceHost) -> None:
    zero(host)
    samples = [ce(n, i) for i, n in enumerate(LENGTHS)]
    host.forward_backward(
        "s", {"loss": {"type": "cross_entropy"}, "samples": samples, "forward_only": True}
    )
    assert all(p.grad is None for p in host.sessions["s"].params)
    host.forward_backward("s", {"loss": {"type": "cross_entropy"}, "samples": samples[:1]})
    host.forward_backward("s", {"loss": {"type": "cross_entropy"}, "samples": samples[1:]})
    split = grads(host)
    zero(host)
    host.forward_backward("s", {"loss": {"type": "cross_entropy"}, "samples": samples})
    for a, b in zip(split, grads(host), strict=True):
        assert bool((a - b).abs().max() <= 1e-5)
    zero(host)


def bad(host: ResourceHost, body: dict[str, Any], field: str, op: str = "forward_backward") -> None:
    before = [p.detach().clone() for p in host.sessions["s"].params]
    with pytest.raises(RLInputError) as err:
        getattr(host, op)("s", body)
    assert err.value.field.startswith(field), err.value.field
    assert all(p.grad is None for p in host.sessions["s"].params)
    assert all(
        bool((a == p).all()) for a, p in zip(before, host.sessions["s"].params, strict=False)
    )


def test_bad_inputs_are_refused_naming_the_field(host: ResourceHost) -> None:
    zero(host)
    good = policy_batch()
    loss = {"type": "ppo"}

    def edited(**change: Any) -> list[dict[str, Any]]:
        s = [dict(x, loss_fn_inputs=dict(x["loss_fn_inputs"])) for x in good]
        s[1]["loss_fn_inputs"].update(change)
        return s

    no_adv = [dict(x, loss_fn_inputs=dict(x["loss_fn_inputs"])) for x in good]
    del no_adv[0]["loss_fn_inputs"]["advantages"]
    bad(host, {"loss": loss, "samples": no_adv}, "samples[0].loss_fn_inputs.advantages")
    bad(
        host,
        {"loss": loss, "samples": edited(advantages=f32([1.0] * 2))},
        "samples[1].loss_fn_inputs.advantages",
    )
    bad(
        host,
        {"loss": loss, "samples": edited(logprobs=i64([1] * LENGTHS[1]))},
        "samples[1].loss_fn_inputs.logprobs",
    )
    bad(host, {"loss": loss, "samples": edited(advantages=f32([float("nan")] * LENGTHS[1]))},
        "samples[1].loss_fn_inputs.advantages")  # fmt: skip
    bad(
        host,
        {"loss": loss, "samples": edited(weights=f32([1.0] * LENGTHS[1]))},
        "samples[1].loss_fn_inputs",
    )
    bad(host, {"loss": loss, "samples": edited(target_tokens=i64([10**6] * LENGTHS[1]))}, "samples")
    bad(host, {"loss": {"type": "LOSS_TYPE_NOPE"}, "samples": good}, "loss.type")
    bad(host, {"loss": {"type": "dro"}, "samples": good}, "loss.dro_params.beta")
    bad(host, {"loss": {"type": "grpo", "grpo_params": {"beta": 0.1}}, "samples": good},
        "samples[0].loss_fn_inputs.reference_logprobs")  # fmt: skip
    bad(host, {"loss": {"type": "ppo", "ppo_params": {"clip_high_threshold": 0.5}}, "samples": good},
        "loss.ppo_params.clip_high_threshold")  # fmt: skip
    bad(host, {"loss": loss, "samples": []}, "samples")
    bad(
        host,
        {"samples": good[:1], "gradients": [f32([1.0])]},
        "gradients[0]",
        "custom_forward_backward",
    )


def test_a_non_finite_loss_applies_no_gradient(host: ResourceHost) -> None:
    from tgnb.emulator.rl.engine import NonFiniteLoss

    zero(host)
    samples = policy_batch(sel=None)
    for s in samples:  # finite float32 inputs whose sum overflows
        n = len(s["loss_fn_inputs"]["advantages"]["data"])
        s["loss_fn_inputs"]["advantages"] = f32([3e38] * n)
        s["loss_fn_inputs"]["logprobs"] = f32([-30.0] * n)
    with pytest.raises(NonFiniteLoss):
        host.forward_backward("s", {"loss": {"type": "importance_sampling"}, "samples": samples})
    assert all(p.grad is None for p in host.sessions["s"].params)
    with pytest.raises(RLInputError) as err:
        host.forward_backward("nope", {"loss": {"type": "ppo"}, "samples": samples})
    assert err.value.field == "session_id"
