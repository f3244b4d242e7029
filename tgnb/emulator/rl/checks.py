"""Validation of resource and session bodies: a 400 whose message names the field, nothing stored.

LoRA settings are checked by the engine's own `tgnb.emulator.rl.inputs.lora_config`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tgnb.emulator.validation import INVALID_ARGUMENT, RequestError

GPU_TYPES = ("B200-SXM",)
MAX_GENERATOR_REPLICAS = 8
INACTIVE_RANGE = (300, 86400)


def bad(field: str, message: str) -> RequestError:
    return RequestError(
        400, INVALID_ARGUMENT, f"{field}: {message}", [{"field": field, "detail": message}]
    )


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad("body", f"the {what} must be a JSON object")
    return body


def _int(body: dict[str, Any], field: str, lo: int, hi: int, default: int, prefix: str = "") -> int:
    value = body.get(field, default)
    name = prefix + field
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"must be an integer between {lo} and {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise bad(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _spec(base_model: Any, extra: Sequence[str]) -> Any:
    from tgnb.emulator.rl.catalog import resolve
    from tgnb.emulator.rl.engine import RLInputError

    try:
        return resolve(base_model, extra)
    except RLInputError as e:
        raise bad("base_model", str(e).removeprefix("base_model: ")) from None


def resource_create(body: Any, extra: Sequence[str]) -> dict[str, Any]:
    """The checked fields of a model-resources create (or estimate-cost) body."""
    body = require_object(body)
    spec = _spec(body.get("base_model"), extra)
    lora = body.get("lora_enabled", True)
    if not isinstance(lora, bool):
        raise bad("lora_enabled", f"must be true or false, got {lora!r}")
    if not lora and not spec.full_weight:
        raise bad("lora_enabled", f"{spec.name} supports LoRA training only")
    compute = require_object(body.get("compute_config"), "compute_config")
    gpu_type = compute.get("gpu_type") or GPU_TYPES[0]
    if gpu_type not in GPU_TYPES:
        raise bad("compute_config.gpu_type", f"must be one of {list(GPU_TYPES)}, got {gpu_type!r}")
    replicas = _int(
        compute, "num_generator_replicas", 0, MAX_GENERATOR_REPLICAS, 1, "compute_config."
    )
    optimizer = require_object(body.get("optimizer_config"), "optimizer_config") or {"adam": {}}
    if not set(optimizer) <= {"adam", "muon"} or len(optimizer) != 1:
        raise bad("optimizer_config", "must hold exactly one of 'adam' or 'muon'")
    timeout = _int(body, "inactive_timeout", *INACTIVE_RANGE, 3600)
    if body.get("base_weights_ref"):
        raise bad("base_weights_ref", "custom base weights are not supported by the emulator")
    return {
        "base_model": spec.name,
        "lora_enabled": lora,
        "num_generator_replicas": replicas,
        "gpu_type": gpu_type,
        "optimizer_config": optimizer,
        "inactive_timeout": timeout,
        "gpus": 1 + replicas,
    }


#: Longest display name of a training session (characters).
MAX_DISPLAY_NAME = 256


def display_name(value: Any) -> str | None:
    """A session's display name: a string of at most `MAX_DISPLAY_NAME` printable characters
    (no NUL, no other control or bidi formatting character), or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad("display_name", "must be a string")
    if len(value) > MAX_DISPLAY_NAME or not value.isprintable():
        raise bad(
            "display_name",
            f"must be at most {MAX_DISPLAY_NAME} printable characters (no control characters)",
        )
    return value


def session_create(body: Any) -> dict[str, Any]:
    """Shape checks of a training-sessions create body (references are checked by the caller)."""
    body = require_object(body)
    rid = body.get("model_resources_id")
    if not isinstance(rid, str) or not rid:
        raise bad("model_resources_id", "required: the id of a READY model resource")
    name = display_name(body.get("display_name"))
    metadata = require_object(body.get("metadata"), "metadata")
    resume = body.get("resume_from_checkpoint_id")
    if resume is not None and (not isinstance(resume, str) or not resume):
        raise bad("resume_from_checkpoint_id", "must be a checkpoint id")
    load_optimizer = body.get("load_optimizer", False)
    if not isinstance(load_optimizer, bool):
        raise bad("load_optimizer", "must be true or false")
    return {
        "model_resources_id": rid,
        "display_name": name,
        "metadata": metadata,
        "resume_from_checkpoint_id": resume,
        "load_optimizer": load_optimizer,
        "lora_config": body.get("lora_config"),
    }
