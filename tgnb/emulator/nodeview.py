"""`NodeInfo`: one emulated node as the emulator's admin route serves it, typed once for both ends.

``GET /_emulator/clusters/{id}/nodes`` answers ``{"nodes": [...]}``, each node rendered by
`NodeInfo.to_wire` (the fleet builds the view) and read back by `NodeInfo.from_wire` (the local
backend's supervisor reads it): the same keys at both ends, nothing probed. A node's directory holds
the file contract of a preemption: the emulator writes `NOTICE_FILE` there at T+0 of the drain window
and `REMOVED_FILE` when the node is removed (T+window). Reading those two files needs no HTTP, so a
supervisor keeps watching its node while the emulator daemon is down or restarting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgnb.events import format_time, parse_time

NOTICE_FILE = "preemption-notice.json"
REMOVED_FILE = "removed.json"


def _rfc3339(t: float | None) -> str | None:
    return None if t is None else format_time(parse_time(t))


@dataclass(frozen=True)
class NodeInfo:
    """One emulated GPU node: a place to run a process group. Times are POSIX seconds."""

    name: str
    cluster_id: str
    kind: str  # "standard" | "preemptible"
    state: str  # "provisioning" | "running" | "draining" | "removed"
    gpus: int
    directory: str | None = None
    deadline: float | None = None  # end of the drain window, once a preemption was notified
    requested_at: float | None = None
    ready_at: float | None = None
    notified_at: float | None = None
    removed_at: float | None = None
    removed_reason: str | None = None

    # -- the wire --------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """The node as the admin route sends it (times as RFC 3339 strings; the deadline in POSIX
        seconds too, ``deadline_unix``)."""
        return {
            "name": self.name,
            "cluster_id": self.cluster_id,
            "kind": self.kind,
            "state": self.state,
            "gpus": self.gpus,
            "requested_at": _rfc3339(self.requested_at),
            "ready_at": _rfc3339(self.ready_at),
            "notified_at": _rfc3339(self.notified_at),
            "deadline": _rfc3339(self.deadline),
            "deadline_unix": self.deadline,
            "removed_at": _rfc3339(self.removed_at),
            "removed_reason": self.removed_reason,
            "dir": self.directory,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> NodeInfo:
        """The inverse of `to_wire`; `ValueError` names a key the answer lacks."""

        def when(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else parse_time(value).timestamp()

        try:
            deadline = data["deadline_unix"]
            directory = data["dir"]
            return cls(
                name=str(data["name"]),
                cluster_id=str(data["cluster_id"]),
                kind=str(data["kind"]),
                state=str(data["state"]),
                gpus=int(data["gpus"]),
                directory=None if directory is None else str(directory),
                deadline=None if deadline is None else float(deadline),
                requested_at=when("requested_at"),
                ready_at=when("ready_at"),
                notified_at=when("notified_at"),
                removed_at=when("removed_at"),
                removed_reason=data.get("removed_reason"),
            )
        except KeyError as exc:
            raise ValueError(f"the emulator's node view lacks {exc.args[0]!r}") from None

    # -- what a backend asks of a node --------------------------------------------------------

    @property
    def preemptible(self) -> bool:
        return self.kind == "preemptible"

    @property
    def notice_file(self) -> Path | None:
        return None if self.directory is None else Path(self.directory) / NOTICE_FILE

    @property
    def removed_file(self) -> Path | None:
        return None if self.directory is None else Path(self.directory) / REMOVED_FILE

    def notified(self) -> bool:
        """A preemption was notified: the API says draining, or the notice file exists."""
        if self.state == "draining":
            return True
        path = self.notice_file
        return path is not None and path.exists()

    def removed(self) -> bool:
        """The node is gone: the API says removed, or the removal file exists."""
        if self.state == "removed":
            return True
        path = self.removed_file
        return path is not None and path.exists()

    @property
    def schedulable(self) -> bool:
        """Running, with no preemption notified (a draining node takes no new work)."""
        return self.state == "running" and not self.notified()
