"""optim-step: Adam (AdamW, decoupled weight decay) or Muon over one session's trainable weights.

Per-step parameters override the group's settings each step; omitted fields keep the defaults
(tinker's Adam: lr 1e-4, betas 0.9/0.95, eps 1e-12, weight decay 0; Muon: torch's, lr 1e-3,
momentum 0.95, 5 Newton-Schulz steps, weight decay 0.1). ``grad_clip_norm`` unset clips the global
gradient norm at 1.0; 0 turns clipping off. Numbers lie in [0, `MAX_VALUE`], Adam's eps in
[`MIN_EPS`, 1]. A session keeps the optimizer kind of its first step
(Muon on the 2-D weights and Adam on the rest, as ``MuonParams.adam`` describes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tgnb.emulator.rl.inputs import RLInputError

ADAM_DEFAULTS: dict[str, float] = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
}
MUON_DEFAULTS: dict[str, float] = {
    "learning_rate": 1e-3,
    "momentum": 0.95,
    "newton_schulz_steps": 5,
    "weight_decay": 0.1,
}
DEFAULT_CLIP = 1.0
#: Every optimizer number lies in [0, MAX_VALUE]; Adam's eps in [MIN_EPS, 1] (eps 0 divides 0 by 0
#: for a weight whose gradient is 0, and the weight becomes NaN).
MAX_VALUE = 1e6
MIN_EPS = 1e-30


@dataclass
class Optimizer:
    """A session's optimizer(s): `kind` "adam" or "muon"; `parts` the torch optimizers."""

    kind: str
    parts: list[Any]

    def state_tensors(self) -> list[Any]:
        return [v for opt in self.parts for st in opt.state.values() for v in st.values()]


def _numbers(
    params: Any, field: str, defaults: Mapping[str, float], extra: tuple[str, ...]
) -> dict[str, Any]:
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise RLInputError(field, "must be an object")
    out: dict[str, Any] = dict(defaults)
    for key, value in params.items():
        if key not in defaults and key not in extra:
            accepted = ", ".join([*defaults, *extra])
            raise RLInputError(f"{field}.{key}", f"unknown parameter (accepted: {accepted})")
        if key == "adam":
            continue
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise RLInputError(f"{field}.{key}", f"must be a finite number, got {value!r}")
        if not 0 <= value <= MAX_VALUE:  # a float32 update: far from overflowing
            raise RLInputError(f"{field}.{key}", f"must be in [0, {MAX_VALUE:g}], got {value!r}")
        out[key] = value
    if "eps" in out and not MIN_EPS <= out["eps"] <= 1:  # 0: 0/0 = NaN where a gradient is 0
        raise RLInputError(f"{field}.eps", f"must be in [{MIN_EPS:g}, 1], got {out['eps']!r}")
    for key in ("beta1", "beta2", "momentum"):
        if key in out and not 0 <= out[key] < 1:
            raise RLInputError(f"{field}.{key}", "must be in [0, 1)")
    if "newton_schulz_steps" in out:
        steps = out["newton_schulz_steps"]
        if int(steps) != steps or not 1 <= steps <= 100:
            raise RLInputError(f"{field}.newton_schulz_steps", "must be an integer in 1..100")
        out["newton_schulz_steps"] = int(steps)
    return out


def parse(body: Any) -> tuple[str, dict[str, Any], dict[str, Any], float]:
    """(kind, main params, adam params for Muon's non-matrix weights, clip norm)."""
    body = body or {}
    if not isinstance(body, Mapping):
        raise RLInputError("body", "must be a JSON object")
    unknown = sorted(set(body) - {"adam_params", "muon_params"})
    if unknown:
        raise RLInputError(unknown[0], "not an optim-step field (adam_params or muon_params)")
    if body.get("adam_params") is not None and body.get("muon_params") is not None:
        raise RLInputError("muon_params", "give adam_params or muon_params, not both")
    if body.get("muon_params") is not None:
        muon = body["muon_params"]
        params = _numbers(muon, "muon_params", MUON_DEFAULTS, ("grad_clip_norm", "adam"))
        adam = _numbers(muon.get("adam"), "muon_params.adam", ADAM_DEFAULTS, ("grad_clip_norm",))
        return "muon", params, adam, float(params.get("grad_clip_norm", DEFAULT_CLIP))
    params = _numbers(body.get("adam_params"), "adam_params", ADAM_DEFAULTS, ("grad_clip_norm",))
    return "adam", params, params, float(params.get("grad_clip_norm", DEFAULT_CLIP))


def _adam(params: list[Any]) -> Any:
    import torch

    return torch.optim.AdamW(params, lr=ADAM_DEFAULTS["learning_rate"], weight_decay=0.0)


def build(kind: str, params: list[Any]) -> Optimizer:
    """The optimizer(s) of a session whose first step is of `kind`."""
    import torch

    if kind == "adam":
        return Optimizer("adam", [_adam(params)])
    matrices = [p for p in params if p.ndim == 2]
    rest = [p for p in params if p.ndim != 2]
    parts = [torch.optim.Muon(matrices)] if matrices else []
    if rest:
        parts.append(_adam(rest))
    return Optimizer("muon", parts)


def step(sess: Any, body: Any) -> None:
    """Apply one optimizer step to `sess` (an engine session) and zero its gradients."""
    import torch

    kind, main, adam, clip = parse(body)
    if sess.optimizer is None:
        sess.optimizer = build(kind, sess.params)
    elif sess.optimizer.kind != kind:
        raise RLInputError(
            f"{kind}_params", f"this session steps with {sess.optimizer.kind}; send its params"
        )
    for opt in sess.optimizer.parts:
        for group in opt.param_groups:
            if isinstance(opt, torch.optim.AdamW):
                group.update(
                    lr=adam["learning_rate"],
                    betas=(adam["beta1"], adam["beta2"]),
                    eps=adam["eps"],
                    weight_decay=adam["weight_decay"],
                )
            else:
                group.update(
                    lr=main["learning_rate"],
                    momentum=main["momentum"],
                    ns_steps=main["newton_schulz_steps"],
                    weight_decay=main["weight_decay"],
                )
    grads = [p for p in sess.params if p.grad is not None]
    if clip > 0 and grads:
        torch.nn.utils.clip_grad_norm_(grads, clip)
    for opt in sess.optimizer.parts:
        opt.step()
        opt.zero_grad(set_to_none=True)
