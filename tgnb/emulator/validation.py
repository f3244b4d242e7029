"""Request validation for the emulated clusters API.

Every field of a create or update body is checked for its type and range before anything is stored
(limits: `MAX_GPUS` GPUs per count field, `MAX_STRING` characters per string, names of
`NAME_PATTERN`); the Together platform's own limits are not published, these are the emulator's.

Errors are `RequestError`s that the app answers with the gRPC-gateway body the clusters API uses:
``{"code": <grpc code>, "message": str, "details": [{"field", "detail"}]}``; the ``tg`` CLI prints
``details[].detail``.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

from tgnb.emulator.models import (
    BILLING_TYPES,
    CLUSTER_TYPES,
    DRIVER_VERSIONS,
    GPU_TYPES,
    GPUS_PER_NODE,
    REGIONS,
)

# gRPC status codes used in error bodies.
INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED = 3, 5, 16

#: Most GPUs one count field may ask for (256 nodes of 8): a create or update beyond is refused,
#: so no request builds an unbounded number of nodes.
MAX_GPUS = 2048
#: Longest string accepted in any field (names, ids, versions, times).
MAX_STRING = 256
#: Cluster names, project ids, volume names: what a Kubernetes object or a Slurm word can hold.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
MAX_DURATION_DAYS = 3650
MAX_SIZE_TIB = 1024
_STRING_FIELDS = (
    "nvidia_version_id",
    "cuda_version",
    "nvidia_driver_version",
    "capacity_pool_id",
    "volume_id",
    "slurm_image",
    "reservation_start_time",
    "reservation_end_time",
)
_OBJECT_FIELDS = ("cluster_config", "oidc_config", "acceptance_tests_params")

CREATE_FIELDS = frozenset(
    {
        "cluster_name",
        "region",
        "gpu_type",
        "num_gpus",
        "billing_type",
        "nvidia_version_id",
        "cuda_version",
        "nvidia_driver_version",
        "cluster_type",
        "num_preemptible_gpus",
        "project_id",
        "num_reserved_gpus",
        "num_capacity_pool_gpus",
        "capacity_pool_id",
        "volume_id",
        "shared_volume",
        "duration_days",
        "slurm_image",
        "slurm_shm_size_gib",
        "auto_scale",
        "auto_scale_max_gpus",
        "install_traefik",
        "cluster_config",
        "add_ons",
        "oidc_config",
        "reservation_start_time",
        "reservation_end_time",
        "acceptance_tests_params",
    }
)
UPDATE_FIELDS = frozenset(
    {
        "num_gpus",
        "num_preemptible_gpus",
        "num_reserved_gpus",
        "num_capacity_pool_gpus",
        "cluster_type",
        "reservation_end_time",
        "cluster_config",
        "add_ons",
    }
)


class RequestError(Exception):
    """A request the API refuses; rendered as ``{code, message, details}``."""

    def __init__(
        self, status: int, code: int, message: str, details: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []

    def body(self) -> dict[str, Any]:
        # the tg CLI shows details[-1]["detail"] (and nothing when details is empty)
        details = self.details or [{"detail": self.message}]
        return {"code": self.code, "message": self.message, "details": details}


class _Problems:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, field: str, detail: str) -> None:
        if len(self.items) >= 10:  # enough to fix; a hostile body with many fields stays small
            return
        field = field if len(field) <= 60 else field[:57] + "..."
        self.items.append({"field": field, "detail": f"{field}: {detail}"})

    def raise_if_any(self) -> None:
        if self.items:
            message = "invalid request: " + "; ".join(i["detail"] for i in self.items)
            raise RequestError(400, INVALID_ARGUMENT, message, self.items)


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _gpu_count(p: _Problems, body: dict[str, Any], name: str, minimum: int) -> None:
    if name not in body or body[name] is None:
        return
    v = body[name]
    if not _is_int(v):
        p.add(name, f"must be an integer, got {type(v).__name__} {v!r}")
    elif v < minimum:
        p.add(name, f"must be >= {minimum}, got {v}")
    elif v > MAX_GPUS:
        p.add(name, f"must be at most {MAX_GPUS} (the emulator's limit), got {v}")
    elif v % GPUS_PER_NODE:
        p.add(name, f"must be a multiple of {GPUS_PER_NODE}, got {v}")


def _unknown(p: _Problems, body: dict[str, Any], known: frozenset[str]) -> None:
    for name in sorted(set(body) - known):
        p.add(name, "unknown field")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _enum(p: _Problems, body: dict[str, Any], name: str, allowed: tuple[str, ...]) -> None:
    v = body.get(name)
    if v is not None and (not isinstance(v, str) or v not in allowed):
        p.add(name, f"unknown value {_short(v)}; expected one of {', '.join(allowed)}")


def _string(p: _Problems, body: dict[str, Any], name: str) -> None:
    v = body.get(name)
    if v is None:
        return
    if not isinstance(v, str):
        p.add(name, f"must be a string, got {type(v).__name__}")
    elif len(v) > MAX_STRING or not v.isprintable():
        p.add(name, f"must be printable and at most {MAX_STRING} characters")


def _name(p: _Problems, body: dict[str, Any], name: str) -> None:
    v = body.get(name)
    if v is None or v == "":
        return
    if not isinstance(v, str) or not NAME_PATTERN.fullmatch(v):
        p.add(
            name,
            f"must be 1-63 letters, digits, '.', '_' or '-' starting with a letter or digit, "
            f"got {_short(v)}",
        )


def _object(p: _Problems, body: dict[str, Any], name: str) -> None:
    v = body.get(name)
    if v is not None and not isinstance(v, dict):
        p.add(name, f"must be a JSON object, got {type(v).__name__}")


def _bool(p: _Problems, body: dict[str, Any], name: str) -> None:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        p.add(name, f"must be true or false, got {type(v).__name__}")


def _int(p: _Problems, body: dict[str, Any], name: str, low: int, high: int) -> None:
    v = body.get(name)
    if v is not None and (not _is_int(v) or not low <= v <= high):
        p.add(name, f"must be an integer from {low} to {high}, got {_short(v)}")


def _add_ons(p: _Problems, body: dict[str, Any]) -> None:
    v = body.get("add_ons")
    if v is None:
        return
    if not isinstance(v, list) or len(v) > 32:
        p.add("add_ons", "must be a list of at most 32 objects")
        return
    for i, a in enumerate(v):
        if not isinstance(a, dict):
            p.add("add_ons", f"item {i} must be an object")
            continue
        for key in ("name", "add_on_type"):
            if a.get(key) is not None and not (
                isinstance(a[key], str) and NAME_PATTERN.fullmatch(a[key])
            ):
                p.add("add_ons", f"item {i}: {key} must be a short name")
        if a.get("config") is not None and not isinstance(a["config"], dict):
            p.add("add_ons", f"item {i}: config must be an object")


def _shared_volume(p: _Problems, body: dict[str, Any]) -> None:
    v = body.get("shared_volume")
    if v is None:
        return
    if not isinstance(v, dict):
        p.add("shared_volume", f"must be an object, got {type(v).__name__}")
        return
    _name(p, v, "volume_name")
    _int(p, v, "size_tib", 1, MAX_SIZE_TIB)
    _string(p, v, "region")
    for key in v:
        if key not in ("volume_name", "size_tib", "region"):
            p.add("shared_volume", f"unknown field {_short(key)}")


def finite_number(value: Any, name: str, low: float, high: float) -> float:
    """A real number (not a bool, not NaN or infinite) from `low` to `high`, else a 400."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(400, INVALID_ARGUMENT, f"{name} must be a finite number")
    if not low <= value <= high:
        raise RequestError(400, INVALID_ARGUMENT, f"{name} must be from {low:g} to {high:g}")
    return float(value)


def integer(value: Any, name: str, low: int, high: int) -> int:
    """An integer (not a bool) from `low` to `high`, else a 400."""
    if not _is_int(value) or not low <= value <= high:
        raise RequestError(400, INVALID_ARGUMENT, f"{name} must be an integer from {low} to {high}")
    return value


def optional_name(value: Any, name: str) -> str | None:
    """None, or a string that `NAME_PATTERN`-like ids fit (at most `MAX_STRING` characters)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_STRING:
        raise RequestError(400, INVALID_ARGUMENT, f"{name} must be a string or null")
    return value


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, INVALID_ARGUMENT, "request body must be a JSON object")
    return body


def validate_create(body: dict[str, Any]) -> dict[str, Any]:
    """Check a create body; return it with the driver resolved (cuda, driver, version id)."""
    p = _Problems()
    _unknown(p, body, CREATE_FIELDS)
    for required in ("cluster_name", "region", "gpu_type", "num_gpus", "billing_type"):
        if body.get(required) in (None, ""):
            p.add(required, "required")
    _name(p, body, "cluster_name")
    _name(p, body, "project_id")
    for name in _STRING_FIELDS:
        _string(p, body, name)
    for name in _OBJECT_FIELDS:
        _object(p, body, name)
    for name in ("auto_scale", "install_traefik"):
        _bool(p, body, name)
    _int(p, body, "duration_days", 1, MAX_DURATION_DAYS)
    _int(p, body, "slurm_shm_size_gib", 0, 65536)
    _gpu_count(p, body, "auto_scale_max_gpus", 0)
    _add_ons(p, body)
    _shared_volume(p, body)
    _gpu_count(p, body, "num_gpus", GPUS_PER_NODE)
    _gpu_count(p, body, "num_preemptible_gpus", 0)
    _gpu_count(p, body, "num_reserved_gpus", 0)
    _gpu_count(p, body, "num_capacity_pool_gpus", 0)
    _enum(p, body, "gpu_type", GPU_TYPES)
    _enum(p, body, "billing_type", BILLING_TYPES)
    _enum(p, body, "cluster_type", CLUSTER_TYPES)
    region = body.get("region")
    if region is not None and (not isinstance(region, str) or region not in REGIONS):
        p.add("region", f"unknown region {_short(region)}; known: {', '.join(REGIONS)}")
    elif (
        region in REGIONS
        and body.get("gpu_type") in GPU_TYPES
        and body["gpu_type"] not in REGIONS[region]
    ):
        p.add("gpu_type", f"{body['gpu_type']} is not offered in {region}")
    pre = body.get("num_preemptible_gpus")
    if _is_int(pre) and pre > 0 and not body.get("project_id"):
        p.add("project_id", "required when num_preemptible_gpus > 0")
    p.raise_if_any()  # the driver lookup below needs well-typed fields
    driver = _resolve_driver(p, body)
    p.raise_if_any()
    out = dict(body)
    out["cuda_version"], out["nvidia_driver_version"], out["nvidia_version_id"] = driver
    return out


def _resolve_driver(p: _Problems, body: dict[str, Any]) -> tuple[str, str, str]:
    vid, cuda, drv = (
        body.get("nvidia_version_id"),
        body.get("cuda_version"),
        body.get("nvidia_driver_version"),
    )
    if vid:
        for i, c, d, _ in DRIVER_VERSIONS:
            if i == vid and (cuda in (None, c)) and (drv in (None, d)):
                return c, d, i
        p.add(
            "nvidia_version_id",
            f"unknown NVIDIA version {_short(vid)} (see GET /v1/compute/regions)",
        )
        return "", "", ""
    if not cuda or not drv:
        p.add(
            "nvidia_version_id",
            "required: give nvidia_version_id or both cuda_version and nvidia_driver_version",
        )
        return "", "", ""
    cuda_bare = str(cuda).split("-")[0]
    for i, c, d, _ in DRIVER_VERSIONS:
        if c == cuda_bare and d == str(drv):
            return str(cuda), str(drv), i
    p.add(
        "nvidia_driver_version", f"no driver {_short(drv)} with CUDA {_short(cuda)} in the catalog"
    )
    return "", "", ""


def validate_update(body: dict[str, Any]) -> dict[str, Any]:
    """Check an update body (omitted fields keep their value)."""
    p = _Problems()
    _unknown(p, body, UPDATE_FIELDS)
    _gpu_count(p, body, "num_gpus", GPUS_PER_NODE)
    _gpu_count(p, body, "num_preemptible_gpus", 0)
    _gpu_count(p, body, "num_reserved_gpus", 0)
    _gpu_count(p, body, "num_capacity_pool_gpus", 0)
    _enum(p, body, "cluster_type", CLUSTER_TYPES)
    _string(p, body, "reservation_end_time")
    _object(p, body, "cluster_config")
    _add_ons(p, body)
    p.raise_if_any()
    return {k: v for k, v in body.items() if v is not None}
