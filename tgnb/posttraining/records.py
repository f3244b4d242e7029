"""Plain, read-only views of what the Post-Training API returns (models, resources, sessions,
checkpoints, cost), built from the SDK's response models. Statuses lose their long prefixes
(``MODEL_RESOURCES_STATUS_READY`` -> ``READY``); int64 fields sent as strings become ints."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

from tgnb.events import maybe_time
from tgnb.posttraining._connect import status_label
from tgnb.prices import money

ACTIVE_SESSION = ("CREATING", "RUNNING", "STOPPING")
ENDED_SESSION = ("STOPPED", "ERROR", "EXPIRED")
ENDED_RESOURCE = ("STOPPING", "STOPPED", "ERROR")


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


as_time = maybe_time  # a service record's timestamp, None when missing or unreadable


@dataclass(frozen=True)
class ModelInfo:
    """A base model the service can host: its LoRA and full-weight limits."""

    name: str
    gpu_type: str
    lora: bool
    full: bool
    max_lora_rank: int | None
    max_seq_length: int | None
    context_length: int | None

    @classmethod
    def from_sdk(cls, m: Any) -> ModelInfo:
        configs = list(getattr(m, "compute_configs", None) or [])
        cfg = next((c for c in configs if c.gpu_type == m.default_gpu_type), None) or (
            configs[0] if configs else None
        )
        trainer = getattr(cfg, "trainer_config", None)
        lora = getattr(trainer, "lora", None)
        full = getattr(trainer, "full", None)
        gen = getattr(cfg, "generator_config", None)
        limits: Any = lora or full
        return cls(
            name=str(m.base_model),
            gpu_type=str(m.default_gpu_type),
            lora=lora is not None,
            full=full is not None,
            max_lora_rank=_int(lora.max_rank) if lora is not None else None,
            max_seq_length=_int(limits.max_seq_length) if limits is not None else None,
            context_length=_int(gen.context_length) if gen is not None else None,
        )


@dataclass(frozen=True)
class ResourceInfo:
    """One model resource as the API last described it."""

    id: str
    base_model: str
    status: str
    lora_enabled: bool
    generators: int
    gpu_type: str | None
    inactive_timeout: int
    created_at: datetime | None
    updated_at: datetime | None
    expires_at: datetime | None
    queue_position: int | None
    error: str | None

    @property
    def active(self) -> bool:
        return self.status not in ENDED_RESOURCE

    @classmethod
    def from_sdk(cls, r: Any) -> ResourceInfo:
        compute = getattr(r, "compute_config", None)
        details = getattr(r, "status_details", None)
        err = getattr(r, "error", None)
        return cls(
            id=str(r.id),
            base_model=str(r.base_model),
            status=status_label(r.status),
            lora_enabled=bool(getattr(r, "lora_enabled", True)),
            generators=_int(getattr(compute, "num_generator_replicas", 0)),
            gpu_type=getattr(compute, "gpu_type", None),
            inactive_timeout=_int(getattr(r, "inactive_timeout", 0)),
            created_at=as_time(getattr(r, "created_at", None)),
            updated_at=as_time(getattr(r, "updated_at", None)),
            expires_at=as_time(getattr(r, "expires_at", None)),
            queue_position=getattr(details, "queue_position", None),
            error=(f"{err.code}: {err.message}" if err is not None else None),
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """A training (weights + optimizer, for resume) or inference (servable) checkpoint."""

    id: str
    kind: str  # "training" | "inference"
    session_id: str
    step: int
    created_at: datetime | None
    #: the policy version of the weights it holds (an inference checkpoint holds the published
    #: weights: the step they were published at); None when the service does not say
    weights_version: int | None = None

    @classmethod
    def from_sdk(cls, c: Any, kind: str, session_id: str) -> CheckpointInfo:
        version = getattr(c, "weights_version", None)
        if version is None:
            extra = getattr(c, "model_extra", None) or {}
            version = extra.get("weights_version") if isinstance(extra, dict) else None
        return cls(
            id=str(c.id),
            kind=kind,
            session_id=session_id,
            step=_int(getattr(c, "step", 0)),
            created_at=as_time(getattr(c, "created_at", None)),
            weights_version=None if version is None else _int(version),
        )


@dataclass(frozen=True)
class Rollback:
    """The service put a session back to a training checkpoint (the local emulator after a
    restart): from `from_step` to `to_step`, at `at`."""

    at: datetime | None
    checkpoint: str
    from_step: int
    to_step: int

    @classmethod
    def list_from(cls, metadata: Any) -> tuple[Rollback, ...]:
        raw = _metadata(metadata).get("emulator_rollbacks")
        out = []
        for r in raw if isinstance(raw, list) else []:
            if isinstance(r, dict):
                out.append(
                    cls(
                        at=as_time(r.get("at")),
                        checkpoint=str(r.get("checkpoint") or ""),
                        from_step=_int(r.get("from_step")),
                        to_step=_int(r.get("to_step")),
                    )
                )
        return tuple(out)


def _metadata(metadata: Any) -> dict[str, Any]:
    if metadata is None:
        return {}
    if isinstance(metadata, dict):
        return metadata
    to_dict = getattr(metadata, "to_dict", None)
    if callable(to_dict):
        with contextlib.suppress(Exception):
            out = to_dict()
            return out if isinstance(out, dict) else {}
    return {}


@dataclass(frozen=True)
class SessionInfo:
    """One training session: status, step, policy versions, checkpoints, LoRA config."""

    id: str
    resource_id: str
    name: str | None
    status: str
    step: int
    policy_version: int
    target_version: int
    lora_rank: int | None
    lora_alpha: float | None
    checkpoints: tuple[CheckpointInfo, ...]
    created_at: datetime | None
    updated_at: datetime | None
    error: str | None
    rollbacks: tuple[Rollback, ...] = ()
    #: what the service said once about how the session was opened (a resume's LoRA config)
    note: str | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_SESSION

    @property
    def label(self) -> str:
        return self.name or self.id

    @classmethod
    def from_sdk(cls, s: Any) -> SessionInfo:
        policy = getattr(s, "policy_state", None)
        lora = getattr(s, "lora_config", None)
        err = getattr(s, "error", None)
        ckpts = [
            CheckpointInfo.from_sdk(c, "training", str(s.id))
            for c in (getattr(s, "training_checkpoints", None) or [])
        ] + [
            CheckpointInfo.from_sdk(c, "inference", str(s.id))
            for c in (getattr(s, "inference_checkpoints", None) or [])
        ]
        ckpts.sort(key=lambda c: (c.created_at is None, c.created_at, c.step))
        return cls(
            id=str(s.id),
            resource_id=str(getattr(s, "resources_id", "") or ""),
            name=getattr(s, "display_name", None) or None,
            status=status_label(s.status),
            step=_int(getattr(s, "step", 0)),
            policy_version=_int(getattr(policy, "applied_weights_version", 0)),
            target_version=_int(getattr(policy, "target_weights_version", 0)),
            lora_rank=getattr(lora, "rank", None),
            lora_alpha=getattr(lora, "alpha", None),
            checkpoints=tuple(ckpts),
            created_at=as_time(getattr(s, "created_at", None)),
            updated_at=as_time(getattr(s, "updated_at", None)),
            error=(f"{err.code}: {err.message}" if err is not None else None),
            rollbacks=Rollback.list_from(getattr(s, "metadata", None)),
            note=_metadata(getattr(s, "metadata", None)).get("resume_lora_config") or None,
        )


@dataclass(frozen=True)
class Cost:
    """What a resource has cost so far: minutes READY (to STOPPED or now), GPU-minutes, dollars.

    `estimated` is True when the READY time was not reported by the service (the real API does not
    expose it; the local emulator does) and was taken from what this client saw instead.
    """

    resource_id: str
    minutes: float
    gpus: int
    price_per_hour: float
    currency: str
    ready_at: datetime | None
    stopped_at: datetime | None
    estimated: bool
    #: which clock `minutes` are on: "platform" (the local emulator's compressed platform time at
    #: `time_scale`: 1 real second is 1/time_scale platform seconds) or "wall" (the service's)
    clock: str = "wall"
    time_scale: float | None = None
    #: the cost so far split among the resource's sessions (label, dollars): `split_by_sessions`
    sessions: tuple[tuple[str, float], ...] = ()

    @property
    def gpu_minutes(self) -> float:
        return self.minutes * self.gpus

    @property
    def unit(self) -> str:
        """``"platform min"`` on a compressed clock, else ``"min"``."""
        return "platform min" if self.clock == "platform" and self.time_scale != 1 else "min"

    @property
    def clock_note(self) -> str:
        """Which clock the minutes are on, in words."""
        if self.clock == "platform" and self.time_scale not in (None, 1):
            return (
                f"platform time of the local emulator at time scale {self.time_scale:g} "
                f"(1 real s = {1 / float(self.time_scale or 1):g} platform s)"
            )
        return "wall-clock time"

    @property
    def amount(self) -> float:
        """Cost so far in `currency`: the resource's hourly price times the hours READY."""
        return self.price_per_hour * self.minutes / 60.0

    def __str__(self) -> str:
        tail = " (estimated: READY time not reported)" if self.estimated else ""
        unit = self.unit
        per = "; ".join(f"{label} {money(usd, self.currency)}" for label, usd in self.sessions)
        return (
            f"{self.resource_id}: {self.minutes:.1f} {unit} READY x {self.gpus} GPU = "
            f"{self.gpu_minutes:.1f} {unit.replace('min', 'GPU-min')}, "
            f"{money(self.amount, self.currency)} at {money(self.price_per_hour, self.currency)}"
            f"/h; {self.clock_note}{tail}" + (f"; per session: {per}" if per else "")
        )


def split_by_sessions(
    amount: float, sessions: Sequence[SessionInfo], now: datetime
) -> tuple[tuple[str, float], ...]:
    """`amount` split among `sessions` by the time each was open (created to its last update
    when stopped, else to `now`): a stretch shared by n open sessions counts 1/n to each. Only
    ratios of the sessions' own times are used, so the split holds on any clock; time with no
    session open is shared in the same proportions. Sessions with no times get nothing."""
    spans = []
    for s in sessions:
        if s.created_at is None:
            continue
        end = now if s.active or s.updated_at is None else s.updated_at
        spans.append((s.label, s.created_at.timestamp(), max(end, s.created_at).timestamp()))
    bounds = sorted({t for _, a, b in spans for t in (a, b)})
    share = [0.0] * len(spans)
    for a, b in pairwise(bounds):
        open_ = [i for i, (_, s, e) in enumerate(spans) if s <= a and e >= b]
        for i in open_:
            share[i] += (b - a) / len(open_)
    total = sum(share)
    weights = share if total > 0 else [1.0] * len(spans)
    return tuple(
        (label, amount * w / sum(weights)) for (label, _, _), w in zip(spans, weights, strict=True)
    )


__all__ = [
    "CheckpointInfo",
    "Cost",
    "ModelInfo",
    "ResourceInfo",
    "Rollback",
    "SessionInfo",
    "split_by_sessions",
]
