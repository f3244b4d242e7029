"""`AdminClient`: the one client of the emulator's admin routes (``/_emulator/...``).

The platform's own routes (``/v1/...``) are reached through the ``together`` SDK; these are the
emulator's extras, which the SDK does not know: health, a cluster's nodes with their state, preempt
a node now, end a drain window, chaos, capacity (a cap, a capacity trace) and the request log.
`Session.preempt`, the local backend's node reader, the demo, the daemon's health check and the test
harness all go through it, so no URL under ``/_emulator`` is built anywhere else.

Errors are httpx's: `httpx.TransportError` when the daemon cannot be reached,
`httpx.HTTPStatusError` (with the emulator's answer in ``response``) for a refused call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from tgnb.config import Secret
from tgnb.emulator.nodeview import NodeInfo

PREFIX = "/_emulator"


def admin_root(base_url: str) -> str:
    """The emulator's root from a base URL as the SDK takes it (with or without ``/v1``)."""
    return base_url.rstrip("/").removesuffix("/v1")


class AdminClient:
    """The admin routes of the emulator at `base_url`, authenticated with `api_key`."""

    def __init__(
        self, base_url: str, api_key: Secret | str | None = None, timeout: float = 30.0
    ) -> None:
        key = api_key.get() if isinstance(api_key, Secret) else api_key
        self.base_url = admin_root(base_url)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=timeout,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url}>"

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        """`path` from the emulator's root (``/_emulator/...``, or ``/v1/...`` in tests)."""
        r = self._http.request(method, path, **kw)
        r.raise_for_status()
        return r.json()

    def health(self) -> dict[str, Any]:
        """The daemon's pid, version, time scale and the like."""
        return dict(self._call("GET", f"{PREFIX}/health"))

    def nodes(self, cluster_id: str) -> list[dict[str, Any]]:
        """Every node of a cluster: name, kind, state, deadline, dir, ... (removed ones too)."""
        body = self._call("GET", f"{PREFIX}/clusters/{cluster_id}/nodes")
        return list(body.get("nodes", body) if isinstance(body, dict) else body)

    def node_infos(self, cluster_id: str) -> list[NodeInfo]:
        """`nodes`, typed: the view the fleet rendered (`tgnb.emulator.nodeview.NodeInfo`)."""
        return [NodeInfo.from_wire(item) for item in self.nodes(cluster_id)]

    def preempt(self, cluster_id: str, node: str | None = None) -> dict[str, Any]:
        """Preempt `node` (default: the oldest running preemptible node); returns the node."""
        body = {"node": node} if node else {}
        return dict(self._call("POST", f"{PREFIX}/clusters/{cluster_id}/preempt", json=body))

    def release(self, cluster_id: str, node: str) -> dict[str, Any]:
        """End a draining node's window now (its workload has exited); it is removed at once."""
        return dict(self._call("POST", f"{PREFIX}/clusters/{cluster_id}/nodes/{node}/release"))

    def requests(self) -> list[dict[str, Any]]:
        """The request log: every /v1 and /v3 request (method, path, query, status, body, chaos)."""
        return list(self._call("GET", f"{PREFIX}/requests")["requests"])

    def clear_requests(self) -> int:
        return int(self._call("DELETE", f"{PREFIX}/requests")["cleared"])

    def chaos(self) -> dict[str, Any]:
        """The chaos settings in force."""
        return dict(self._call("GET", f"{PREFIX}/chaos"))

    def set_chaos(
        self,
        fraction: float,
        seed: int = 0,
        kinds: tuple[str, ...] | None = None,
        delay_s: float | None = None,
        retry_after_ms: int | None = None,
    ) -> dict[str, Any]:
        """Answer `fraction` of /v1 requests with 429/503/delay (`kinds`), drawn from `seed`."""
        body: dict[str, Any] = {"fraction": fraction, "seed": seed}
        if kinds is not None:
            body["kinds"] = list(kinds)
        if delay_s is not None:
            body["delay_s"] = delay_s
        if retry_after_ms is not None:
            body["retry_after_ms"] = retry_after_ms
        return dict(self._call("POST", f"{PREFIX}/chaos", json=body))

    def set_capacity(self, gpus: int | None, cluster_id: str | None = None) -> dict[str, Any]:
        """Cap preemptible GPUs (all clusters, or one); None lifts the cap."""
        body = {"gpus": gpus, "cluster_id": cluster_id}
        return dict(self._call("POST", f"{PREFIX}/capacity", json=body))

    def set_capacity_trace(
        self,
        segments: Sequence[Mapping[str, Any]] | None = None,
        *,
        generate: Mapping[str, Any] | None = None,
        cluster_id: str | None = None,
    ) -> dict[str, Any]:
        """Start a capacity trace now (`tgnb.emulator.trace`): `segments` (``[{"at_s": 0,
        "gpus": 16}, {"at_s": 600, "gpus": 8}, ...]``, platform seconds) or a seeded `generate`
        document; for one cluster or, without `cluster_id`, all. Returns the trace in force."""
        body: dict[str, Any] = {}
        if segments is not None:
            body["segments"] = [dict(s) for s in segments]
        if generate is not None:
            body["generate"] = dict(generate)
        if cluster_id is not None:
            body["cluster_id"] = cluster_id
        return dict(self._call("POST", f"{PREFIX}/capacity/trace", json=body)["trace"])

    def clear_capacity_trace(self) -> None:
        """End the capacity trace in force (the capacity it left is no longer limited by it)."""
        self._call("DELETE", f"{PREFIX}/capacity/trace")

    def capacity_trace(self) -> dict[str, Any] | None:
        """The trace in force: its segments, ``now_s`` and ``gpus_now`` (platform time); or None."""
        trace = self._call("GET", f"{PREFIX}/capacity/trace")["trace"]
        return None if trace is None else dict(trace)

    # -- Post-Training resources ---------------------------------------------------------------
    def rl_usage(self, resource_id: str) -> dict[str, Any]:
        """A Post-Training resource's GPU-seconds/minutes (platform time), cost and price."""
        return dict(self._call("GET", f"{PREFIX}/rl/resources/{resource_id}/usage"))

    def rl_memory(self, resource_id: str) -> int | None:
        """Bytes the resource's engine holds in tensors (None while its model is not loaded)."""
        value = self._call("GET", f"{PREFIX}/rl/resources/{resource_id}/memory")["memory_bytes"]
        return None if value is None else int(value)

    def rl_expire(self, resource_id: str) -> dict[str, Any]:
        """Make a resource idle-expired now (it stops, its sessions EXPIRED, unless one is busy)."""
        return dict(self._call("POST", f"{PREFIX}/rl/resources/{resource_id}/expire"))


__all__ = ["PREFIX", "AdminClient", "admin_root"]
