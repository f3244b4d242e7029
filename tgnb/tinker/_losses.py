"""Tinker 0.38's losses that Post-Training has no primitive for, computed on the client.

``gspo`` runs as Tinker's ``forward_backward_custom`` does: a scoring pass over the service's
``forward-backward`` (``forward_only``, per-token logprobs returned), the loss and its gradient
with respect to each token's logprob computed here, then the service's
``custom-forward-backward`` with those gradients. The objective is Tinker's GSPO-token (its
"Loss functions" docs): over the positions ``sequence_ratio_mask`` marks, the sequence
log-ratio ``L = mean(logp - q)``; every token's ratio has the value ``s = exp(L)`` and its own
logprob's gradient; the loss is ``-sum_t min(s * A_t, clip(s, lo, hi) * A_t)``. Its gradient is
therefore ``-s * A_t`` where the unclipped term is the minimum and ``0`` where the clipped one
is, which is computed exactly with numpy (no torch needed). The clip bounds are
``loss_fn_config``'s ``clip_low_threshold`` / ``clip_high_threshold``, PPO's [0.8, 1.2] unless
given (`TINKER_LOSS_DEFAULTS`).

``stable_reinforce`` is refused: its objective reads stability information Tinker's sampler
records per sampled sequence (``record_stability_info=True``, named by ``sequence_id``), and
Post-Training's sampler records none, so no client can compute it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from together.post_training.tinker import types
from together.post_training.tinker._training import _to_custom_request
from together.types.post_training.operation_custom_forward_backward_params import Gradient

from tgnb.tinker._support import Resolved

#: The losses this module serves on the client.
CLIENT_LOSSES = frozenset({"gspo"})

#: GSPO's inputs, besides ``target_tokens``.
GSPO_INPUTS = ("logprobs", "advantages", "sequence_ratio_mask")

GSPO_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def refuse_unserved(loss_fn: str) -> None:
    """One line for a Tinker loss that no client can compute on Post-Training."""
    if loss_fn == "stable_reinforce":
        raise NotImplementedError(
            "loss_fn='stable_reinforce' reads the stability information Tinker's sampler records "
            "per sequence (record_stability_info=True), which Post-Training's sampler does not "
            "record: train with 'gspo', 'ppo', 'cispo' or 'importance_sampling'"
        )


def check_gspo(data: list[types.Datum], config: Mapping[str, Any] | None) -> dict[str, float]:
    """The clip bounds of a ``gspo`` call, after checking its data carries GSPO's inputs."""
    unknown = sorted(set(config or {}) - set(GSPO_DEFAULTS))
    if unknown:
        raise ValueError(f"loss_fn_config for 'gspo' takes {sorted(GSPO_DEFAULTS)}, not {unknown}")
    for i, datum in enumerate(data):
        missing = [k for k in ("target_tokens", *GSPO_INPUTS) if k not in datum.loss_fn_inputs]
        if missing:
            raise ValueError(
                f"loss_fn='gspo' needs loss_fn_inputs {['target_tokens', *GSPO_INPUTS]}; "
                f"datum {i} lacks {missing}"
            )
    return {**GSPO_DEFAULTS, **{k: float(v) for k, v in (config or {}).items()}}


def _array(datum: types.Datum, key: str) -> np.ndarray:
    return np.asarray(datum.loss_fn_inputs[key].tolist(), dtype=np.float64).reshape(-1)


def gspo(
    data: list[types.Datum], logprobs: list[Any], bounds: Mapping[str, float]
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Each datum's d(loss)/d(logprob) and the call's metrics (``loss:sum``, the mean clipped
    fraction of sequences), from the scoring pass's per-token `logprobs`."""
    low, high = bounds["clip_low_threshold"], bounds["clip_high_threshold"]
    grads: list[np.ndarray] = []
    total, clipped = 0.0, 0
    for datum, row in zip(data, logprobs, strict=True):
        logp = np.asarray(list(row), dtype=np.float64).reshape(-1)
        q, adv = _array(datum, "logprobs"), _array(datum, "advantages")
        in_ratio = _array(datum, "sequence_ratio_mask") != 0
        if not len(logp) == len(q) == len(adv) == len(in_ratio):
            raise ValueError(
                "loss_fn='gspo': logprobs, advantages and sequence_ratio_mask must each have one "
                f"entry per target token ({len(logp)})"
            )
        log_ratio = float((logp - q)[in_ratio].mean()) if in_ratio.any() else 0.0
        s = float(np.exp(log_ratio))
        s_clip = min(max(s, low), high)
        unclipped, clipped_term = s * adv, s_clip * adv
        total -= float(np.minimum(unclipped, clipped_term).sum())
        grads.append(np.where(unclipped <= clipped_term, -s * adv, 0.0))
        clipped += int(s_clip != s)
    return grads, {"loss:sum": total, "gspo/clipped_fraction": clipped / max(len(data), 1)}


def scoring_data(data: list[types.Datum]) -> list[types.Datum]:
    """`data` as the scoring and gradient passes take it: the model input and its targets."""
    return [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"]},
        )
        for d in data
    ]


class ClientLosses:
    """`TrainingClient`'s ``forward`` / ``forward_backward`` for `CLIENT_LOSSES` (a mixin over
    the SDK layer's trainer: its scoring and gradient submissions)."""

    _session: Any

    def _client_loss(
        self, data: list[types.Datum], config: Mapping[str, Any] | None, *, backward: bool
    ) -> Any:
        bounds = check_gspo(data, config)
        samples, loss = _to_custom_request(scoring_data(data), "logprobs")
        scoring = self._session.run(self._submit_scoring_pass_async(samples, loss))  # type: ignore[attr-defined]
        forward_out = scoring.result()
        grads, metrics = gspo(
            data, [o["logprobs"].tolist() for o in forward_out.loss_fn_outputs], bounds
        )
        if not backward:
            return Resolved(_output(forward_out, metrics))
        submit = self._submit_custom_grads_async(samples, _wire(grads), metrics, forward_out)  # type: ignore[attr-defined]
        return self._session.run(submit)

    async def _client_loss_async(
        self, data: list[types.Datum], config: Mapping[str, Any] | None, *, backward: bool
    ) -> Any:
        bounds = check_gspo(data, config)
        samples, loss = _to_custom_request(scoring_data(data), "logprobs")
        forward_out = await (await self._submit_scoring_pass_async(samples, loss))  # type: ignore[attr-defined]
        grads, metrics = gspo(
            data, [o["logprobs"].tolist() for o in forward_out.loss_fn_outputs], bounds
        )
        if not backward:
            return Resolved(_output(forward_out, metrics))
        return await self._submit_custom_grads_async(samples, _wire(grads), metrics, forward_out)  # type: ignore[attr-defined]


def _wire(grads: list[np.ndarray]) -> list[Gradient]:
    return [Gradient(data=g.astype(np.float32).tolist(), dtype="D_TYPE_FLOAT32") for g in grads]


def _output(forward_out: Any, metrics: dict[str, float]) -> Any:
    return types.ForwardBackwardOutput(
        loss_fn_output_type="", loss_fn_outputs=forward_out.loss_fn_outputs, metrics=metrics
    )
