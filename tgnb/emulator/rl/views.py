"""Records as the API shows them: every field the SDK's lenient parsing needs is always present.

int64 values (steps, policy versions) are sent as strings, as the real service does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from tgnb.emulator.rl.state import (
    R_READY,
    CheckpointRecord,
    ResourceRecord,
    SessionRecord,
    ts,
)

CREATED_BY = "emulator-user"
DEFAULT_POLICY_STATE = {
    "applied_weights_version": "0",
    "target_weights_version": "0",
    "trainer_step": "0",
    "pending_publish": False,
}

__all__ = ["checkpoint", "checkpoint_ref", "page", "resource", "session", "ts", "usage"]


def resource(r: ResourceRecord, queue_position: int | None, expires_at: float | None) -> dict:
    details: dict[str, Any] = {}
    if queue_position is not None:
        details["queue_position"] = queue_position
    out: dict[str, Any] = {
        "id": r.id,
        "base_model": r.base_model,
        "compute_config": {
            "gpu_type": r.gpu_type,
            "num_generator_replicas": r.num_generator_replicas,
        },
        "created_at": ts(r.created_at),
        "updated_at": ts(r.updated_at),
        "created_by": CREATED_BY,
        "inactive_timeout": r.inactive_timeout,
        "lora_enabled": r.lora_enabled,
        "optimizer_config": r.optimizer_config,
        "status": r.status,
        "status_details": details,
    }
    if r.status == R_READY and expires_at is not None:
        out["expires_at"] = ts(expires_at)
    if r.error is not None:
        out["error"] = r.error
    if r.base_weights_ref:
        out["base_weights_ref"] = r.base_weights_ref
    return out


def checkpoint_ref(c: CheckpointRecord) -> dict[str, Any]:
    out = {"id": c.id, "created_at": ts(c.created_at), "step": str(c.step)}
    if c.weights_version is not None:  # the policy version of the weights it holds
        out["weights_version"] = str(c.weights_version)
    return out


def _policy_state(raw: dict[str, Any]) -> dict[str, Any]:
    out = dict(DEFAULT_POLICY_STATE)
    for k, v in raw.items():
        out[k] = v if isinstance(v, bool) or k not in DEFAULT_POLICY_STATE else str(v)
    return out


def session(s: SessionRecord, checkpoints: dict[str, CheckpointRecord]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": s.id,
        "base_model": s.base_model,
        "model_resources_id": s.resource_id,
        "created_at": ts(s.created_at),
        "updated_at": ts(s.updated_at),
        "created_by": CREATED_BY,
        "status": s.status,
        "step": str(s.step),
        "metadata": s.metadata,
        "policy_state": _policy_state(s.policy_state),
        "training_checkpoints": [
            checkpoint_ref(checkpoints[c]) for c in s.training_checkpoints if c in checkpoints
        ],
        "inference_checkpoints": [
            checkpoint_ref(checkpoints[c]) for c in s.inference_checkpoints if c in checkpoints
        ],
    }
    if s.display_name:
        out["display_name"] = s.display_name
    if s.lora_config is not None:
        out["lora_config"] = s.lora_config
    if s.resume_from_checkpoint_id:
        out["resume_from_checkpoint_id"] = s.resume_from_checkpoint_id
    if s.error is not None:
        out["error"] = s.error
    return out


def checkpoint(c: CheckpointRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": c.id,
        "base_model": c.base_model,
        "created_at": ts(c.created_at),
        "session_id": c.session_id,
        "step": str(c.step),
        "type": c.type,
    }
    if c.lora_rank is not None:
        out["lora_rank"] = c.lora_rank
    if c.weights_version is not None:
        out["weights_version"] = str(c.weights_version)
    return out


T = TypeVar("T")


def page(
    items: Sequence[T], query: dict[str, str], render: Callable[[T], dict[str, Any]]
) -> dict[str, Any]:
    """``{data, meta}`` of a list route: ``after`` (an id) and ``limit`` (1-100, default 100)."""
    after = query.get("after")
    if after:
        ids = [getattr(i, "id", None) for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    try:
        limit = max(1, min(100, int(query.get("limit") or 100)))
    except ValueError:
        limit = 100
    shown = items[:limit]
    more = len(items) > limit
    return {
        "data": [render(i) for i in shown],
        "meta": {
            "has_more": more,
            "limit": limit,
            "next_cursor": getattr(shown[-1], "id", None) if more and shown else None,
        },
    }


def usage(r: ResourceRecord, now: float, time_scale: float, price: float) -> dict[str, Any]:
    """A resource's usage report at `now`: GPU-seconds (platform time, at `time_scale`) from
    READY to STOPPED (or now), their cost at `price` dollars per GPU-hour, and the times."""
    end = r.stopped_at if r.stopped_at is not None else now
    platform_s = 0.0
    if r.ready_at is not None:
        since = r.billing_since if r.billing_since is not None else r.ready_at
        scale = r.billing_scale or time_scale or 1.0
        platform_s = r.billed_s + max(0.0, end - since) / scale
    gpu_seconds = r.gpus * platform_s
    granted = r.creating_at if r.creating_at is not None else (r.stopped_at or now)
    return {
        "model_resources_id": r.id,
        "resource_id": r.id,
        "status": r.status,
        "created_at": ts(r.created_at),
        "queued_s": max(0.0, granted - r.created_at),  # real seconds spent PENDING
        "gpus": r.gpus,
        "gpu_type": r.gpu_type,
        "clock": "platform",  # GPU-seconds/minutes and cost: platform time
        "time_scale": time_scale,
        "gpu_seconds": gpu_seconds,
        "gpu_minutes": gpu_seconds / 60.0,
        "unbilled_downtime_s": r.unbilled_downtime_s,  # real seconds, daemon down
        # since when this daemon's life bills (READY, or its restart); before: billed_s
        "billing_since": ts(r.billing_since),
        "billed_before_s": r.billed_s * r.gpus,  # GPU-seconds of earlier lives
        "price_per_gpu_hour": price,
        "cost": gpu_seconds / 3600.0 * price,
        "currency": "USD",
        "ready_at": ts(r.ready_at),
        "stopped_at": ts(r.stopped_at),
    }
