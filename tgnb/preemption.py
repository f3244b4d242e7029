"""`Preemption`: what `tgnb.Session.preempt` did, as the notebook shows it (a sentence, HTML)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from tgnb.events import parse_time

__all__ = ["Preemption"]


@dataclass(frozen=True)
class Preemption:
    """What `Session.preempt` did: the node, when its notice came (T+0) and the end of its drain
    window, when the platform removes it (its workload checkpoints in between)."""

    node: str
    cluster_id: str
    gpus: int
    notified_at: datetime | None
    deadline: datetime | None

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> Preemption:
        def when(key: str) -> datetime | None:
            value = view.get(key)
            return parse_time(value) if isinstance(value, str) and value else None

        return cls(
            node=str(view.get("name") or "?"),
            cluster_id=str(view.get("cluster_id") or ""),
            gpus=int(view.get("gpus") or 0),
            notified_at=when("notified_at"),
            deadline=when("deadline"),
        )

    @property
    def drain_window(self) -> timedelta | None:
        """Platform time between the notice and the removal (300 s, scaled on the emulator)."""
        if self.notified_at is None or self.deadline is None:
            return None
        return self.deadline - self.notified_at

    def __repr__(self) -> str:
        def clock(t: datetime | None) -> str:
            return t.strftime("%H:%M:%SZ") if t is not None else "-"

        window = self.drain_window
        span = f", a {window.total_seconds():g} s drain window" if window is not None else ""
        return (
            f"<Preemption {self.node}: notice at {clock(self.notified_at)}, "
            f"removed at {clock(self.deadline)}{span}>"
        )

    def __str__(self) -> str:
        """A sentence: ``node X (8 GPUs) preempted: notice at 12:00:01 UTC, removed at ...``."""

        def clock(t: datetime | None) -> str:
            return t.strftime("%H:%M:%S UTC") if t is not None else "not known yet"

        gpus = f" ({self.gpus} GPUs)" if self.gpus else ""
        window = self.drain_window
        span = f" (a {window.total_seconds():g} s drain window)" if window is not None else ""
        return (
            f"node {self.node}{gpus} preempted: notice at {clock(self.notified_at)}, "
            f"removed at {clock(self.deadline)}{span}"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        from tgnb.markup import escape

        return f"<div class='tgnb-preemption'>{escape(str(self))}</div>"
