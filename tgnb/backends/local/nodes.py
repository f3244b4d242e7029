"""The emulated nodes a local run can be placed on, as the emulator's admin endpoint shows them.

``GET /_emulator/clusters/{id}/nodes`` lists every node of a cluster as the emulator's typed view,
`tgnb.emulator.nodeview.NodeInfo` (name, kind, state, GPUs, the end of its drain window once a
preemption was notified, and its directory, where the emulator writes the notice and removal files
that a supervisor watches without HTTP). The fleet renders that view and this side reads it back:
one type at both ends.

`cluster_reader` reads the cluster itself over the clusters API (the official SDK, as a session
does): its ``node_lifecycle_events``, for the preemption rate re-estimated at a restart.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import httpx

from tgnb.cloud import Cloud, ClusterState, RetryPolicy
from tgnb.emulator.admin import AdminClient
from tgnb.emulator.nodeview import NodeInfo

__all__ = ["NodeInfo", "NodeSource", "cluster_reader", "env_endpoint"]


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
            return admin.node_infos(self.cluster_id)
        except (httpx.TransportError, OSError):
            admin.close()
            self._admin = None  # look the daemon up again next time
            raise


def env_endpoint() -> tuple[str, str | None]:
    """The emulator's base URL and key from ``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY``."""
    return os.environ.get("TOGETHER_BASE_URL", ""), os.environ.get("TOGETHER_API_KEY")


def cluster_reader(
    cluster_id: str, endpoint: Callable[[], tuple[str, str | None]], timeout: float = 5.0
) -> Callable[[], ClusterState]:
    """A callable reading cluster `cluster_id` now through the clusters API at `endpoint`
    (one try, `timeout` seconds: the caller keeps what it had when it fails)."""

    def read() -> ClusterState:
        base, key = endpoint()
        once = RetryPolicy(attempts=1)
        with Cloud(
            api_key=key or "", base_url=base, timeout=timeout, max_retries=0, retry=once
        ) as c:
            return c.attach(cluster_id).state()

    return read
