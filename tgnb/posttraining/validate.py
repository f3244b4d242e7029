"""Checks made before any Post-Training request: each raises `tgnb.errors.ValidationError` with a
one-line message naming the fix, and nothing is sent.

The bounds are the platform's documented ones (inactive timeout 300-86400 s). A LoRA config is
checked for its types (and a positive alpha, a dropout in [0, 1)); the service's own rules -- a
model's LoRA rank range, the sessions a resource holds, which names are the same model -- are the
service's to enforce: `tgnb.posttraining.resource` turns its refusal into the same one-line fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tgnb.errors import ValidationError

#: Inactive timeout bounds of a model resource, in seconds (the API's).
MIN_INACTIVE_TIMEOUT = 300
MAX_INACTIVE_TIMEOUT = 86400
#: Generator replicas a resource may ask for here (0: a trainer-only resource).
MAX_GENERATORS = 8
LORA_KEYS = ("rank", "alpha", "dropout", "seed", "train_unembed")
VARIANTS = {
    "adapter": "CHECKPOINT_VARIANT_ADAPTER",
    "merged": "CHECKPOINT_VARIANT_MERGED",
}

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def _int(value: Any, what: str, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"{what} must be a whole number, got {value!r}: try {example}")
    return value


def check_base_model(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not name.strip()
        or (any(c.isspace() for c in name) and not Path(name).expanduser().is_dir())
    ):
        raise ValidationError(
            f"base_model {name!r} is not a model name: pick one of pt.models() "
            "(e.g. 'tgnb/tiny-llama') or a local model directory"
        )
    return name


def check_generators(value: Any) -> int:
    n = _int(value, "generators", "generators=1")
    if not 0 <= n <= MAX_GENERATORS:
        raise ValidationError(
            f"generators={n} is out of range: use 0 (trainer only) to {MAX_GENERATORS}, e.g. 1"
        )
    return n


def check_inactive_timeout(value: Any) -> int | None:
    if value is None:
        return None
    n = _int(value, "inactive_timeout", "inactive_timeout=900")
    if not MIN_INACTIVE_TIMEOUT <= n <= MAX_INACTIVE_TIMEOUT:
        raise ValidationError(
            f"inactive_timeout={n} is out of range: use {MIN_INACTIVE_TIMEOUT} to "
            f"{MAX_INACTIVE_TIMEOUT} seconds, e.g. 900"
        )
    return n


def check_lora(config: Any) -> dict[str, Any] | None:
    """A LoRA config as the SDK's ``LoraConfig``: rank a whole number (its range is the model's,
    the service's to check), alpha a number > 0 (a float too, as the service takes), dropout in
    [0, 1), seed, train_unembed. None keeps the server's defaults."""
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise ValidationError(f"lora must be a dict, got {config!r}: try lora={{'rank': 8}}")
    unknown = sorted(set(config) - set(LORA_KEYS))
    if unknown:
        raise ValidationError(
            f"unknown LoRA key {unknown[0]!r}: use {', '.join(LORA_KEYS)} (e.g. lora={{'rank': 8}})"
        )
    out: dict[str, Any] = {}
    if "rank" in config:
        out["rank"] = _int(config["rank"], "LoRA rank", "rank=8")
    if "alpha" in config:
        alpha = config["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise ValidationError(f"LoRA alpha must be a number, got {alpha!r}: try alpha=16")
        if not alpha > 0:  # NaN too
            raise ValidationError(f"LoRA alpha {alpha} must be > 0: try alpha=16 (twice the rank)")
        out["alpha"] = alpha
    if "dropout" in config:
        dropout = config["dropout"]
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not 0 <= dropout < 1
        ):
            raise ValidationError(f"LoRA dropout {dropout!r} must be in [0, 1): try dropout=0.05")
        out["dropout"] = float(dropout)
    if "seed" in config:
        out["seed"] = _int(config["seed"], "LoRA seed", "seed=0")
    if "train_unembed" in config:
        if not isinstance(config["train_unembed"], bool):
            raise ValidationError(
                f"LoRA train_unembed must be True or False, got {config['train_unembed']!r}"
            )
        out["train_unembed"] = config["train_unembed"]
    return out


def check_name(name: Any) -> str | None:
    """A session's display name: letters, digits, '.', '_' and '-', up to 64 characters."""
    if name is None:
        return None
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValidationError(
            f"session name {name!r} is not valid: use up to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. 'lr-1e-4')"
        )
    return name


def check_id(value: Any, what: str, hint: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ValidationError(f"{what} {value!r} is not an id: {hint}")
    return value


def check_variant(variant: Any) -> str:
    """'adapter' or 'merged' (or the API's CHECKPOINT_VARIANT_* name) -> the API's name."""
    if isinstance(variant, str):
        v = variant.strip()
        if v.lower() in VARIANTS:
            return VARIANTS[v.lower()]
        if v in VARIANTS.values():
            return v
    raise ValidationError(
        f"checkpoint variant {variant!r} is not known: use 'adapter' (LoRA weights, load with "
        "peft) or 'merged' (full weights)"
    )


def check_out_dir(out: Any) -> Path:
    if not isinstance(out, (str, Path)) or not str(out).strip():
        raise ValidationError(f"out={out!r} is not a directory path: try out='checkpoints/run1'")
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValidationError(f"out={str(out)!r} is a file: give a directory to download into")
    return path


def check_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Client-side metrics: names are identifiers, values finite numbers."""
    import math

    if not metrics:
        raise ValidationError("record() needs at least one metric: e.g. record(reward_mean=0.4)")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.isidentifier():
            raise ValidationError(f"metric name {key!r} must be a Python identifier")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)  # numpy / torch scalars
            except (TypeError, ValueError):
                raise ValidationError(
                    f"metric {key}={value!r} is not a number: record plain floats"
                ) from None
        if not math.isfinite(float(value)):
            raise ValidationError(f"metric {key}={value!r} is not finite: record a finite number")
        out[key] = float(value)
    return out


__all__ = [
    "LORA_KEYS",
    "MAX_GENERATORS",
    "VARIANTS",
    "check_base_model",
    "check_generators",
    "check_id",
    "check_inactive_timeout",
    "check_lora",
    "check_metrics",
    "check_name",
    "check_out_dir",
    "check_variant",
]
