"""The emulated nodes a local run can be placed on, as the emulator's admin endpoint shows them.

``GET /_emulator/clusters/{id}/nodes`` lists every node of a cluster with its name, kind
(``standard`` or ``preemptible``), state (``provisioning``, ``running``, ``draining``, ``removed``),
the end of its drain window when a preemption was notified, and its directory: the emulator writes
``preemption-notice.json`` there at T+0 of a preemption and ``removed.json`` when the node is
removed (T+window). Reading those two files needs no HTTP, so a supervisor keeps watching its node
while the emulator daemon is down or restarting.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tgnb.emulator.admin import AdminClient
from tgnb.runs.spec import GPUS_PER_NODE

NOTICE_FILE = "preemption-notice.json"
REMOVED_FILE = "removed.json"


@dataclass(frozen=True)
class NodeInfo:
    """One emulated GPU node: a place to run a process group."""

    name: str
    kind: str  # "standard" | "preemptible"
    state: str  # "provisioning" | "running" | "draining" | "removed"
    directory: str | None = None
    deadline: float | None = None  # end of the drain window (POSIX seconds) once notified
    gpus: int = GPUS_PER_NODE

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

    @classmethod
    def from_api(cls, record: Mapping[str, Any]) -> NodeInfo:
        deadline = record.get("deadline_unix")
        directory = record.get("dir", record.get("directory", record.get("path")))
        return cls(
            name=str(record.get("name") or record.get("node_id")),
            kind=str(record.get("kind", "standard")),
            state=str(record.get("state", "running")),
            directory=None if directory is None else str(directory),
            deadline=None if deadline is None else float(deadline),
            gpus=int(record.get("gpus") or record.get("num_gpus") or GPUS_PER_NODE),
        )


class NodeSource:
    """Reads a cluster's nodes from the emulator, finding the daemon again after a restart.

    `endpoint` returns ``(base_url, api_key)``; it is called again after a connection error, so a
    daemon that came back on another port is found. `nodes()` raises `httpx.HTTPError` (or
    `OSError`) when the emulator cannot be reached; callers retry.
    """

    def __init__(
        self, cluster_id: str, endpoint: Callable[[], tuple[str, str | None]], timeout: float = 5.0
    ) -> None:
        self.cluster_id = cluster_id
        self._endpoint = endpoint
        self._timeout = timeout
        self._admin: AdminClient | None = None

    def _client(self) -> AdminClient:
        if self._admin is None:
            base, key = self._endpoint()
            self._admin = AdminClient(base, key, timeout=self._timeout)
        return self._admin

    def nodes(self) -> list[NodeInfo]:
        admin = self._client()
        try:
            items = admin.nodes(self.cluster_id)
        except (httpx.TransportError, OSError):
            admin.close()
            self._admin = None  # look the daemon up again next time
            raise
        return [NodeInfo.from_api(item) for item in items]


def env_endpoint() -> tuple[str, str | None]:
    """The emulator's base URL and key from ``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY``."""
    return os.environ.get("TOGETHER_BASE_URL", ""), os.environ.get("TOGETHER_API_KEY")
