"""The built-in losses of the Post-Training API, with the reference (tinker) math, and their inputs.

Every sample is ``{model_input, loss_fn_inputs}``; slot i of each input tensor refers to the token
that follows model_input token i, so every tensor has exactly ``len(model_input tokens)`` entries.
The batch is right-padded to one ``[B, T]`` tensor per input; padding never counts.

Notation: ``logp`` = the current policy's log-probability of ``target_tokens``, ``q`` = the
sampler's ``logprobs``, ``A`` = ``advantages``, ``r = exp(logp - q)``, ``clip(r) =
clamp(r, clip_low_threshold, clip_high_threshold)`` (defaults 0.8 and 1.2), ``sg`` = stop-gradient,
``m`` = 1 where the token counts: ``weights`` or ``mask`` non-zero (policy losses treat any
non-zero weight as 1), every real token when neither is given.

Defaults (chosen here; Together documents none of them): the clip range of GRPO, PPO and CISPO
is [0.8, 1.2] (PPO's customary epsilon 0.2, the same for the three so a change of loss changes
only the formula), DPPO's ``delta_low`` / ``delta_high`` 0.15, GRPO's ``beta`` 0 with
TOKEN_MEAN and TOKEN ratios; DRO's ``beta`` is required. Tinker's defaults differ for CISPO
([0.0, 4.0]); ``tgnb.tinker`` sends Tinker's defaults explicitly, so a Tinker script computes
what it computed on Tinker, whatever the service's defaults are.

Normalisation (chosen here; the real service does not document its own): the reference losses are
SUMS over tokens and samples, exactly tinker's, so the caller normalises through its advantages or
weights (and the value does not depend on how a batch is split into calls):

- CROSS_ENTROPY: ``-Σ w·logp`` (fractional weights honoured)
- IMPORTANCE_SAMPLING: ``-Σ m·r·A``
- PPO: ``-Σ m·min(r·A, clip(r)·A)``
- CISPO: ``-Σ m·sg(clip(r))·logp·A``
- DRO: ``-Σ m·(logp·A - ½β(logp - q)²)`` (``beta`` required)
- DPPO: ``-Σ m·r·A`` where a token whose probability already moved past the trust region in the
  direction its advantage pushes (``p - p_old > delta_high`` with A > 0, ``p_old - p > delta_low``
  with A < 0; ``p = exp(logp)``, probability space, defaults 0.15) contributes ``sg(r)·A`` (no
  gradient), as PPO's clip does in ratio space.
- GRPO is the one aggregated loss: per token ``ℓ = -(min(r·A, clip(r)·A) - β·KL)`` with the k3
  estimator ``KL = exp(ref - logp) - (ref - logp) - 1`` (``reference_logprobs`` required when
  β > 0, default β = 0). ``ratio_type`` SEQUENCE uses one ratio per sequence,
  ``exp(mean_t m·(logp - q))`` (GSPO). ``agg_type``: TOKEN_MEAN (default) ``Σ m·ℓ / Σ m``;
  SEQUENCE_MEAN the mean over sequences of ``Σ_t m·ℓ / Σ_t m``; FIXED_HORIZON ``Σ m·ℓ / (B·T)``
  with T the longest model_input of the batch (Dr. GRPO's constant horizon).

Metrics: ``loss:sum`` (the loss, as tinker's compat layer names it), ``num_tokens`` (tokens that
count), and for ratio losses ``ratio_mean`` and ``clip_fraction`` (tokens whose ratio lies outside
the clip range or, for DPPO, the trust region); GRPO adds ``kl`` when β > 0. A loss that is not
finite, or gradients that are not, are refused before anything is applied (NON_FINITE_LOSS).
Log-ratios are capped at `MAX_LOG_RATIO` before exp(), so a ratio never overflows float32 (sampler
logprobs far below the policy's: the capped token gets no gradient, as a clipped one does); a
metric that is still not finite is reported as ``null`` (`tgnb.emulator.rl.operations.json_safe`).
Numeric parameters lie within ±`MAX_PARAM`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tgnb.emulator.rl.inputs import NonFiniteLoss, RLInputError

if TYPE_CHECKING:
    import torch

#: Dtypes accepted per input (as the SDK's own table).
INPUT_DTYPES: dict[str, frozenset[str]] = {
    "target_tokens": frozenset({"int64"}),
    "logprobs": frozenset({"float32"}),
    "advantages": frozenset({"float32"}),
    "reference_logprobs": frozenset({"float32"}),
    "weights": frozenset({"int64", "float32"}),
    "mask": frozenset({"int64", "float32"}),
}
_POLICY = (frozenset({"target_tokens", "logprobs", "advantages"}), frozenset({"weights", "mask"}))
#: loss type -> (params key, required inputs, optional inputs, {param: default}, required params)
LOSSES: dict[str, tuple[str, frozenset[str], frozenset[str], dict[str, Any], frozenset[str]]] = {
    "LOSS_TYPE_CROSS_ENTROPY": (
        "cross_entropy_params",
        frozenset({"target_tokens", "weights"}),
        frozenset(),
        {},
        frozenset(),
    ),
    "LOSS_TYPE_GRPO": (
        "grpo_params",
        _POLICY[0],
        _POLICY[1] | {"reference_logprobs"},
        {
            "clip_low_threshold": 0.8,
            "clip_high_threshold": 1.2,
            "beta": 0.0,
            "agg_type": "GRPO_LOSS_AGGREGATION_TYPE_TOKEN_MEAN",
            "ratio_type": "GRPO_LOSS_RATIO_TYPE_TOKEN",
        },
        frozenset(),
    ),
    "LOSS_TYPE_IMPORTANCE_SAMPLING": ("importance_sampling_params", *_POLICY, {}, frozenset()),
    "LOSS_TYPE_PPO": (
        "ppo_params",
        *_POLICY,
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        frozenset(),
    ),
    "LOSS_TYPE_CISPO": (
        "cispo_params",
        *_POLICY,
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        frozenset(),
    ),
    "LOSS_TYPE_DPPO": (
        "dppo_params",
        *_POLICY,
        {"delta_low": 0.15, "delta_high": 0.15},
        frozenset(),
    ),
    "LOSS_TYPE_DRO": ("dro_params", *_POLICY, {"beta": 0.0}, frozenset({"beta"})),
}
#: Log-ratios above it are capped before exp() (float32 holds exp(88) at most).
MAX_LOG_RATIO = 80.0
#: The largest magnitude of a numeric loss parameter (a clip threshold of 1e308 is inf in float32).
MAX_PARAM = 1e6
_AGG = {
    "GRPO_LOSS_AGGREGATION_TYPE_UNSPECIFIED",
    "GRPO_LOSS_AGGREGATION_TYPE_FIXED_HORIZON",
    "GRPO_LOSS_AGGREGATION_TYPE_TOKEN_MEAN",
    "GRPO_LOSS_AGGREGATION_TYPE_SEQUENCE_MEAN",
}
_RATIO = {"GRPO_LOSS_RATIO_TYPE_TOKEN", "GRPO_LOSS_RATIO_TYPE_SEQUENCE"}


@dataclass(frozen=True)
class LossSpec:
    type: str
    params: dict[str, Any]
    required: frozenset[str]
    optional: frozenset[str]


def parse_loss(loss: Any) -> LossSpec:
    """Validate ``body["loss"]`` (``{type, <kind>_params?}``); short names (``"grpo"``) accepted."""
    if not isinstance(loss, Mapping) or "type" not in loss:
        raise RLInputError(
            "loss", "must be an object with a 'type', e.g. {'type': 'LOSS_TYPE_GRPO'}"
        )
    raw = loss["type"]
    name = raw if isinstance(raw, str) else ""
    if name and not name.startswith("LOSS_TYPE_"):
        name = "LOSS_TYPE_" + name.upper()
    if name not in LOSSES:
        raise RLInputError("loss.type", f"unknown loss {raw!r}; one of {', '.join(LOSSES)}")
    key, required, optional, defaults, required_params = LOSSES[name]
    unknown = sorted(k for k in loss if k not in ("type", key))
    if unknown:
        raise RLInputError(f"loss.{unknown[0]}", f"not a parameter of {name} (use loss.{key})")
    given = loss.get(key) or {}
    if not isinstance(given, Mapping):
        raise RLInputError(f"loss.{key}", "must be an object")
    for k in given:
        if k not in defaults:
            allowed = ", ".join(defaults) or "none"
            raise RLInputError(f"loss.{key}.{k}", f"unknown parameter (accepted: {allowed})")
    for k in required_params:
        if k not in given:
            raise RLInputError(f"loss.{key}.{k}", f"is required for {name}")
    params = dict(defaults)
    for k, v in given.items():
        field = f"loss.{key}.{k}"
        if k in ("agg_type", "ratio_type"):
            allowed_set = _AGG if k == "agg_type" else _RATIO
            if v not in allowed_set:
                raise RLInputError(field, f"must be one of {', '.join(sorted(allowed_set))}")
            if v != "GRPO_LOSS_AGGREGATION_TYPE_UNSPECIFIED":
                params[k] = v
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise RLInputError(field, f"must be a finite number, got {v!r}")
        if abs(v) > MAX_PARAM:  # the losses compute in float32
            raise RLInputError(field, f"must lie in [-{MAX_PARAM:g}, {MAX_PARAM:g}], got {v!r}")
        params[k] = float(v)
    if "clip_low_threshold" in params:
        if not 0 <= params["clip_low_threshold"] <= 1:
            raise RLInputError(f"loss.{key}.clip_low_threshold", "must be in [0, 1]")
        if params["clip_high_threshold"] < 1:
            raise RLInputError(f"loss.{key}.clip_high_threshold", "must be >= 1")
    for k in ("delta_low", "delta_high"):
        if k in params and not 0 <= params[k] <= 1:
            raise RLInputError(f"loss.{key}.{k}", "must be in [0, 1]")
    if name == "LOSS_TYPE_GRPO" and params["beta"] < 0:
        raise RLInputError(f"loss.{key}.beta", "must be >= 0")
    if name == "LOSS_TYPE_GRPO" and params["beta"] > 0:
        required = required | {"reference_logprobs"}
    return LossSpec(name, params, required, optional)


def compute(
    spec: LossSpec, logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], valid: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """(loss, metrics, counted) for `[B, T]` policy logprobs; `counted` marks the positions the
    loss uses (the others are reported as 0 in loss_fn_outputs)."""
    import torch

    validf = valid.to(logp.dtype)
    if spec.type == "LOSS_TYPE_CROSS_ENTROPY":
        w = inputs["weights"].to(logp.dtype) * validf
        loss = -(w * logp).sum()
        counted = (w != 0) & valid
        return loss, _metrics(loss, counted), counted
    sel = inputs.get("weights", inputs.get("mask"))
    m = validf if sel is None else ((sel != 0) & valid).to(logp.dtype)
    counted = m.bool()
    q = inputs["logprobs"].to(logp.dtype)
    adv = inputs["advantages"].to(logp.dtype)
    p = spec.params
    # zero where not counted, so exp() stays finite on padding; capped so a ratio never overflows
    # float32 (exp(80) ~ 5.5e34): beyond the cap a token gets no gradient, as a clipped one
    log_ratio = ((logp - q) * m).clamp(max=MAX_LOG_RATIO)
    if spec.type == "LOSS_TYPE_GRPO" and p["ratio_type"] == "GRPO_LOSS_RATIO_TYPE_SEQUENCE":
        per_seq = log_ratio.sum(-1) / m.sum(-1).clamp(min=1)
        ratio = torch.exp(per_seq)[:, None].expand_as(logp)
    else:
        ratio = torch.exp(log_ratio)
    extra: dict[str, float] = {}
    clipped = torch.zeros_like(counted)
    if spec.type == "LOSS_TYPE_IMPORTANCE_SAMPLING":
        loss = -(m * ratio * adv).sum()
    elif spec.type in ("LOSS_TYPE_PPO", "LOSS_TYPE_GRPO", "LOSS_TYPE_CISPO"):
        lo, hi = p["clip_low_threshold"], p["clip_high_threshold"]
        clip_r = ratio.clamp(lo, hi)
        clipped = counted & ((ratio < lo) | (ratio > hi))
        if spec.type == "LOSS_TYPE_CISPO":
            loss = -(m * clip_r.detach() * logp * adv).sum()
        else:
            surrogate = torch.minimum(ratio * adv, clip_r * adv)
            if spec.type == "LOSS_TYPE_PPO":
                loss = -(m * surrogate).sum()
            else:
                per_token = -surrogate
                if p["beta"] > 0:
                    d = (inputs["reference_logprobs"].to(logp.dtype) - logp) * m
                    kl = torch.exp(d) - d - 1
                    per_token = per_token + p["beta"] * kl
                    extra["kl"] = float((kl * m).sum() / m.sum().clamp(min=1))
                loss = _aggregate(per_token * m, m, p["agg_type"])
    elif spec.type == "LOSS_TYPE_DPPO":
        prob, prob_old = torch.exp(logp * m), torch.exp(q * m)
        blocked = counted & (
            ((adv > 0) & (prob - prob_old > p["delta_high"]))
            | ((adv < 0) & (prob_old - prob > p["delta_low"]))
        )
        clipped = blocked
        term = torch.where(blocked, ratio.detach() * adv, ratio * adv)
        loss = -(m * term).sum()
    elif spec.type == "LOSS_TYPE_DRO":
        loss = -(m * (logp * adv - 0.5 * p["beta"] * (logp - q) ** 2)).sum()
    else:  # pragma: no cover - parse_loss admits only the types above
        raise RLInputError("loss.type", f"unsupported loss {spec.type}")
    n = m.sum().clamp(min=1)
    extra["ratio_mean"] = float((ratio.detach() * m).sum() / n)
    extra["clip_fraction"] = float(clipped.sum() / n)
    return loss, {**_metrics(loss, counted), **extra}, counted


def _aggregate(terms: torch.Tensor, m: torch.Tensor, agg: str) -> torch.Tensor:
    if agg == "GRPO_LOSS_AGGREGATION_TYPE_SEQUENCE_MEAN":
        per_seq_n = m.sum(-1)
        has = per_seq_n > 0
        per_seq = terms.sum(-1) / per_seq_n.clamp(min=1)
        return (per_seq * has).sum() / has.sum().clamp(min=1)
    if agg == "GRPO_LOSS_AGGREGATION_TYPE_FIXED_HORIZON":
        return terms.sum() / (terms.shape[0] * terms.shape[1])
    return terms.sum() / m.sum().clamp(min=1)


def _metrics(loss: torch.Tensor, counted: torch.Tensor) -> dict[str, float]:
    return {"loss:sum": float(loss.detach()), "num_tokens": float(counted.sum())}


def accumulate(params: list[Any], loss: torch.Tensor) -> None:
    """Backpropagate `loss` and add its gradients to what `params` hold, only when every sum is
    finite: else NonFiniteLoss and the accumulated gradients stay as they were (the weights can
    never be stepped to NaN)."""
    import torch

    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        loss.backward()
        total = [
            new if old is None or new is None else old + new
            for old, new in zip(saved, (p.grad for p in params), strict=True)
        ]
        finite = all(t is None or bool(torch.isfinite(t).all()) for t in total)
    except BaseException:
        for p, old in zip(params, saved, strict=True):
            p.grad = old
        raise
    if not finite:
        for p, old in zip(params, saved, strict=True):
            p.grad = old
        raise NonFiniteLoss("the gradients are not finite in float32; no gradient applied")
    for p, t in zip(params, total, strict=True):
        p.grad = t
