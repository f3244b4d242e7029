"""`tgnb.events.Event`s of a model resource and its sessions, from the API's records.

The records carry created/updated times and statuses; the READY time comes from the emulator's usage
report when there is one, else from what this client saw (`Resource` notes when ``start`` returned).
Each event has ``source="posttraining"``, ``run`` = the lane it belongs to (the resource id or the
session id) and ``data`` = ``{"resource", "session"?, "name"?, ...}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tgnb import events as ev
from tgnb.events import Event
from tgnb.posttraining.records import ResourceInfo, SessionInfo

SOURCE = "posttraining"

_SESSION_END = {
    "STOPPED": ev.SESSION_STOPPED,
    "EXPIRED": ev.SESSION_EXPIRED,
    "ERROR": ev.SESSION_ERROR,
}


def resource_events(
    info: ResourceInfo,
    ready_at: datetime | None = None,
    stopped_at: datetime | None = None,
) -> list[Event]:
    data: dict[str, Any] = {"resource": info.id, "base_model": info.base_model}
    out: list[Event] = []
    if info.created_at is not None:
        out.append(
            Event(
                info.created_at, SOURCE, ev.RESOURCE_CREATED, info.base_model, None, info.id, data
            )
        )
    if info.queue_position is not None and info.status in ("PENDING", "CREATING"):
        when = info.updated_at or info.created_at
        if when is not None:
            out.append(
                Event(
                    when,
                    SOURCE,
                    ev.RESOURCE_QUEUED,
                    f"queue position {info.queue_position}",
                    None,
                    info.id,
                    {**data, "queue_position": info.queue_position},
                )
            )
    if ready_at is not None:
        out.append(Event(ready_at, SOURCE, ev.RESOURCE_READY, "", None, info.id, data))
    if info.status in ("STOPPING", "STOPPED"):
        when = stopped_at or info.updated_at
        if when is not None:
            out.append(Event(when, SOURCE, ev.RESOURCE_STOPPED, "", None, info.id, data))
    elif info.status == "ERROR" and info.updated_at is not None:
        out.append(
            Event(info.updated_at, SOURCE, ev.RESOURCE_ERROR, info.error or "", None, info.id, data)
        )
    return out


def session_events(s: SessionInfo) -> list[Event]:
    data: dict[str, Any] = {"resource": s.resource_id, "session": s.id}
    if s.name:
        data["name"] = s.name
    lane = s.id
    out: list[Event] = []
    if s.created_at is not None:
        rank = f"LoRA rank {s.lora_rank}" if s.lora_rank else ""
        out.append(Event(s.created_at, SOURCE, ev.SESSION_STARTED, rank, None, lane, data))
    for c in s.checkpoints:
        if c.created_at is not None:
            out.append(
                Event(
                    c.created_at,
                    SOURCE,
                    ev.SESSION_CHECKPOINT,
                    f"{c.kind} checkpoint {c.id}",
                    None,
                    lane,
                    {**data, "kind": c.kind, "step": c.step, "checkpoint": c.id},
                )
            )
    for rb in s.rollbacks:
        if rb.at is not None:
            out.append(
                Event(
                    rb.at,
                    SOURCE,
                    ev.SESSION_ROLLED_BACK,
                    f"rolled back from step {rb.from_step} to step {rb.to_step} "
                    f"(training checkpoint {rb.checkpoint})",
                    None,
                    lane,
                    {
                        **data,
                        "from_step": rb.from_step,
                        "to_step": rb.to_step,
                        "checkpoint": rb.checkpoint,
                    },
                )
            )
    reason = _SESSION_END.get(s.status)
    if reason is not None and s.updated_at is not None:
        out.append(
            Event(s.updated_at, SOURCE, reason, s.error or "", None, lane, {**data, "step": s.step})
        )
    return out


def all_events(
    info: ResourceInfo,
    sessions: Iterable[SessionInfo],
    usage: Mapping[str, Any] | None = None,
    seen_ready: datetime | None = None,
) -> list[Event]:
    """Every event of a resource and its sessions, sorted by time."""
    from tgnb.posttraining.records import as_time

    ready = as_time((usage or {}).get("ready_at")) or seen_ready
    stopped = as_time((usage or {}).get("stopped_at"))
    out = resource_events(info, ready, stopped)
    for s in sessions:
        out += session_events(s)
    return ev.dedupe(out)


__all__ = ["SOURCE", "all_events", "resource_events", "session_events"]
