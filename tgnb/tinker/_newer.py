"""What newer Tinker releases added that code written for them reads: Tinker 0.38's provenance.

Tinker 0.38 gives every sampled sequence a ``sequence_id`` and lets a ``Datum`` carry
*provenance* (``PromptProvenanceSpan`` / ``SampledProvenanceSpan`` runs naming those ids), which
its ``stable_reinforce`` loss needs. The cookbook since 0.6 (``rl/data_processing.py``,
``completers.py``) names both span classes at import and reads ``sequence_id`` off every sample.

The Post-Training API names no sampled sequence and takes no provenance (nor that loss), so this
layer answers what Tinker documents for a sequence without an id: ``sequence_id`` is ``None``
on every sequence it samples, and the cookbook then attaches no provenance (as it does for a
custom completer's samples). ``record_stability_info=`` (what 0.38's sampling clients record for
that loss) is accepted when false and refused when true. The span classes are Tinker 0.38's own where the installed
``tinker`` has them, else the same frozen dataclasses (fields and checks) defined here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import tinker as _genuine
from together.post_training.tinker import types


@dataclass(frozen=True, kw_only=True)
class _Span:
    sequence_id: str
    offset: int = 0
    length: int

    def __post_init__(self) -> None:
        name = type(self).__name__
        if self.length < 0:
            raise ValueError(f"{name}.length must be >= 0, got {self.length}")
        if not self.sequence_id:
            raise ValueError(f"{name}.sequence_id must be non-empty")
        if self.offset < 0:
            raise ValueError(f"{name}.offset must be >= 0, got {self.offset}")


class PromptProvenanceSpan(_Span):
    """Positions ``[offset, offset + length)`` of a sampled sequence's request prompt."""


class SampledProvenanceSpan(_Span):
    """Positions ``[offset, offset + length)`` of a sampled sequence's sampled tokens."""


@dataclass(frozen=True)
class SampledSequence(types.SampledSequence):
    """Tinker's sampled sequence with Tinker 0.38's ``sequence_id``: ``None`` (see above)."""

    sequence_id: str | None = None  # type: ignore[assignment, unused-ignore]


def identified(response: types.SampleResponse) -> types.SampleResponse:
    """`response` with each sequence answering ``sequence_id`` (``None``)."""
    if all(hasattr(seq, "sequence_id") for seq in response.sequences):
        return response
    sequences = [
        SampledSequence(**{f.name: getattr(seq, f.name) for f in dataclasses.fields(seq) if f.init})
        for seq in response.sequences
    ]
    return dataclasses.replace(response, sequences=sequences)


def no_stability_info(record_stability_info: bool) -> None:
    """Refuse Tinker 0.38's ``record_stability_info=True``: nothing here would read it."""
    if record_stability_info:
        raise NotImplementedError(
            "record_stability_info=True records what Tinker's stable_reinforce loss trains on, "
            "which Post-Training does not serve: train with loss_fn='importance_sampling' "
            "(or 'ppo', 'cispo')"
        )


NEWER: dict[str, Any] = {
    cls.__name__: getattr(_genuine, cls.__name__, cls)
    for cls in (PromptProvenanceSpan, SampledProvenanceSpan)
}
"""The names ``tinker`` answers for these: Tinker's own where it has them."""


#: Tinker 0.38's sampling client kinds (``types.SamplingClientKind``).
SAMPLER_KINDS = ("snapshot", "inflight")


def sampler_kind(kind: str) -> str:
    """Check ``save_weights_and_get_sampling_client(kind=)``. Both kinds are served by the same
    ``weights-sync``: a Post-Training session's sampler serves the weights it last published, so
    ``"inflight"`` (updated in place by each later publish) is what it does natively, and a
    ``"snapshot"`` client sees the same in-place updates (no sampler keeps older weights)."""
    if kind not in SAMPLER_KINDS:
        raise ValueError(f"kind must be one of {list(SAMPLER_KINDS)}, got {kind!r}")
    return kind


def console_url(conn: Any, route: str) -> str:
    """``get_console_url``: Post-Training has no console page per run, so this answers the URL
    of its API record (``GET`` with the API key answers it)."""
    root = (conn.base_url or "https://api.together.ai").rstrip("/")
    return f"{root}/v1/rl/{route}"


def optimizer_config(optimizer: Any) -> None:
    """Check ``create_lora_training_client(optimizer=)``: AdamW (Tinker's default and
    Post-Training's only optimizer) is served; another is refused."""
    kind = getattr(optimizer, "type", None)
    if optimizer is not None and kind != "adamw":
        raise NotImplementedError(
            f"optimizer {kind or optimizer!r}: Post-Training trains with AdamW only; pass "
            "types.AdamOptimizerConfig() or leave optimizer unset"
        )


def optimizer_params(optim_params: Any, adam_params: Any) -> Any:
    """The ``AdamParams`` of tinker 0.38's ``optim_step(optim_params, *, adam_params=)``."""
    if optim_params is not None and adam_params is not None:
        raise TypeError("optim_step takes optim_params or adam_params, not both")
    params = optim_params if optim_params is not None else adam_params
    if params is None:
        raise TypeError("optim_step needs the step's parameters: optim_step(types.AdamParams(...))")
    if not isinstance(params, types.AdamParams):
        raise NotImplementedError(
            f"{type(params).__name__}: Post-Training's optimizer step is AdamW's; pass "
            "types.AdamParams(...)"
        )
    return params
