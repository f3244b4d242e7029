"""The installed ``tinker``, from 0.23.1 (what ``together[tinker]`` pins) to the newest (0.38).

The ``together`` SDK's Tinker layer (``together.post_training.tinker``, which this package
extends) was written against tinker 0.23.1. Two things in it break on newer releases:

- its converters import ``tinker.types.topk_prompt_logprobs.TopkPromptLogprobs``, which tinker
  0.38 renamed ``tinker.types.topk_logprobs.TopkLogprobs`` (the same two matrices). `prepare`
  answers the old module name with the new class, so the SDK's layer imports; it adds that one
  name to ``sys.modules`` and changes nothing else of the genuine package.
- its sample responses build ``SampledSequence`` without the ``sequence_id`` tinker 0.38
  requires: this package builds its sample responses itself (`sampled_sequence`, used by
  `tgnb.tinker._sampling`).

`prepare` runs when ``tgnb.tinker`` is imported, before anything imports the SDK's layer.
"""

from __future__ import annotations

import dataclasses
import sys
import types as _modules
from typing import Any

import tinker as _genuine
from tinker import types

_OLD_TOPK = "tinker.types.topk_prompt_logprobs"


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


#: The installed tinker's version, e.g. ``(0, 38, 0)``.
TINKER_VERSION: tuple[int, ...] = _version(getattr(_genuine, "__version__", "0"))


def prepare() -> None:
    """Let the SDK's layer import against the installed tinker (see the module docstring)."""
    if _OLD_TOPK in sys.modules:
        return
    try:
        __import__(_OLD_TOPK)
    except ModuleNotFoundError:
        from tinker.types.topk_logprobs import TopkLogprobs

        module = _modules.ModuleType(_OLD_TOPK, "tinker 0.38's TopkLogprobs, by its 0.23 name.")
        module.TopkPromptLogprobs = TopkLogprobs  # type: ignore[attr-defined]
        module.__all__ = ["TopkPromptLogprobs"]  # type: ignore[attr-defined]
        sys.modules[_OLD_TOPK] = module


def has_field(cls: type, name: str) -> bool:
    """Whether dataclass (or pydantic model) `cls` of the installed tinker has field `name`."""
    if dataclasses.is_dataclass(cls):
        return any(f.name == name for f in dataclasses.fields(cls))
    return name in getattr(cls, "model_fields", {})


def topk_class() -> Any:
    """The installed tinker's class for top-k logprob matrices."""
    prepare()
    from tinker.types.topk_prompt_logprobs import TopkPromptLogprobs

    return TopkPromptLogprobs


def sampled_sequence(**fields: Any) -> Any:
    """A ``types.SampledSequence`` of the installed tinker; where it has ``sequence_id`` (0.38
    on), ``None``: the API names no sampled sequence (`tgnb.tinker._newer`)."""
    if has_field(types.SampledSequence, "sequence_id"):
        fields.setdefault("sequence_id", None)
    return types.SampledSequence(**fields)


prepare()
