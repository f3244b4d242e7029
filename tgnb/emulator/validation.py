"""Request validation for the emulated clusters API.

Errors are `RequestError`s that the app answers with the gRPC-gateway body the clusters API uses:
``{"code": <grpc code>, "message": str, "details": [{"field", "detail"}]}``; the ``tg`` CLI prints
``details[].detail``.
"""

from __future__ import annotations

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
    elif v % GPUS_PER_NODE:
        p.add(name, f"must be a multiple of {GPUS_PER_NODE}, got {v}")


def _unknown(p: _Problems, body: dict[str, Any], known: frozenset[str]) -> None:
    for name in sorted(set(body) - known):
        p.add(name, "unknown field")


def _enum(p: _Problems, body: dict[str, Any], name: str, allowed: tuple[str, ...]) -> None:
    v = body.get(name)
    if v is not None and v not in allowed:
        p.add(name, f"unknown value {v!r}; expected one of {', '.join(allowed)}")


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
    cluster_name = body.get("cluster_name")
    if cluster_name is not None and not isinstance(cluster_name, str):
        p.add("cluster_name", "must be a string")
    _gpu_count(p, body, "num_gpus", GPUS_PER_NODE)
    _gpu_count(p, body, "num_preemptible_gpus", 0)
    _gpu_count(p, body, "num_reserved_gpus", 0)
    _gpu_count(p, body, "num_capacity_pool_gpus", 0)
    _enum(p, body, "gpu_type", GPU_TYPES)
    _enum(p, body, "billing_type", BILLING_TYPES)
    _enum(p, body, "cluster_type", CLUSTER_TYPES)
    region = body.get("region")
    if region is not None and region not in REGIONS:
        p.add("region", f"unknown region {region!r}; known: {', '.join(REGIONS)}")
    elif (
        region in REGIONS
        and body.get("gpu_type") in GPU_TYPES
        and body["gpu_type"] not in REGIONS[region]
    ):
        p.add("gpu_type", f"{body['gpu_type']} is not offered in {region}")
    pre = body.get("num_preemptible_gpus")
    if _is_int(pre) and pre > 0 and not body.get("project_id"):
        p.add("project_id", "required when num_preemptible_gpus > 0")
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
        p.add("nvidia_version_id", f"unknown NVIDIA version {vid!r} (see GET /v1/compute/regions)")
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
    p.add("nvidia_driver_version", f"no driver {drv!r} with CUDA {cuda!r} in the catalog")
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
    p.raise_if_any()
    return {k: v for k, v in body.items() if v is not None}
