"""Shared storage volumes: ``/v1/compute/clusters/storage/volumes`` (the SDK's ``clusters.storage``).

The routes and shapes are the SDK's (``ClusterStorage {volume_id, volume_name, size_tib, status}``):

- ``POST   .../volumes`` ``{region, size_tib, volume_name, instance_cluster_id?,
  is_lifecycle_independent?, project_id?}`` -> ClusterStorage (status ``available``);
- ``GET    .../volumes[?project_id=]`` -> ``{volumes: [ClusterStorage]}`` (not paginated);
- ``GET    .../volumes/{volume_id}`` -> ClusterStorage; ``PUT .../volumes`` ``{volume_id, size_tib}``
  resizes (growing only: a volume holds data);
- ``DELETE .../volumes/{volume_id}`` -> ``{success: true}``; refused (400) while a cluster uses it,
  as the SDK documents.

A cluster created with ``volume_id`` must name an existing volume of its project and region (400
naming ``volume_id`` otherwise: nothing is invented); it is then ``bound`` until the cluster is
deleted. A ``shared_volume`` in a create body makes a new volume, deleted with its cluster unless
``is_lifecycle_independent``. Volumes persist in ``<state_dir>/volumes.json``.
"""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path
from typing import Any

from tgnb.emulator.store import atomic_write_json
from tgnb.emulator.validation import INVALID_ARGUMENT, NOT_FOUND, RequestError

MAX_SIZE_TIB = 1024
_FIELDS = ("volume_id", "volume_name", "size_tib", "status")


def _bad(field: str, message: str) -> RequestError:
    return RequestError(
        400, INVALID_ARGUMENT, f"{field}: {message}", [{"field": field, "detail": message}]
    )


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE_TIB:
        raise _bad("size_tib", f"must be a whole number of TiB from 1 to {MAX_SIZE_TIB}")
    return value


class Volumes:
    """Every shared volume of the emulator, thread-safe, saved on each change."""

    def __init__(self, path: Path, default_project: str, regions: tuple[str, ...]) -> None:
        self.path = Path(path)
        self.default_project = default_project
        self.regions = regions
        self._lock = threading.RLock()
        self._items: dict[str, dict[str, Any]] = {}
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        for v in raw.get("volumes", []) if isinstance(raw, dict) else []:
            if isinstance(v, dict) and isinstance(v.get("volume_id"), str):
                self._items[v["volume_id"]] = v

    def _save(self) -> None:
        atomic_write_json(self.path, {"version": 1, "volumes": list(self._items.values())})

    @staticmethod
    def to_api(v: dict[str, Any]) -> dict[str, Any]:
        return {k: v[k] for k in _FIELDS}

    def _get(self, volume_id: Any) -> dict[str, Any]:
        v = self._items.get(volume_id) if isinstance(volume_id, str) else None
        if v is None:
            raise RequestError(404, NOT_FOUND, f"shared volume {str(volume_id)[:80]!r} not found")
        return v

    # ---- the routes' work ----------------------------------------------------------------------
    def create(self, body: dict[str, Any], *, cluster_id: str | None = None) -> dict[str, Any]:
        name = body.get("volume_name")
        if not isinstance(name, str) or not name.strip() or len(name) > 63:
            raise _bad("volume_name", "required: a name of 1 to 63 characters")
        region = body.get("region")
        if region not in self.regions:
            raise _bad("region", f"must be one of {', '.join(self.regions)}")
        size = _size(body.get("size_tib"))
        independent = body.get("is_lifecycle_independent", False)
        if not isinstance(independent, bool):
            raise _bad("is_lifecycle_independent", "must be true or false")
        project = body.get("project_id") or self.default_project
        v = {
            "volume_id": f"vol-{uuid.uuid4().hex[:12]}",
            "volume_name": name,
            "size_tib": size,
            "status": "bound" if cluster_id else "available",
            "region": region,
            "project_id": project,
            "is_lifecycle_independent": independent,
            "cluster_id": cluster_id,
        }
        with self._lock:
            self._items[v["volume_id"]] = v
            self._save()
        return v

    def retrieve(self, volume_id: str) -> dict[str, Any]:
        with self._lock:
            return self.to_api(self._get(volume_id))

    def list(self, project_id: str | None) -> dict[str, Any]:
        with self._lock:
            items = [v for v in self._items.values() if project_id in (None, "", v["project_id"])]
            return {"volumes": [self.to_api(v) for v in items]}

    def update(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            v = self._get(body.get("volume_id"))
            if "size_tib" in body:
                size = _size(body["size_tib"])
                if size < v["size_tib"]:
                    raise _bad("size_tib", f"a volume grows only: it holds {v['size_tib']} TiB now")
                v["size_tib"] = size
                self._save()
            return self.to_api(v)

    def delete(self, volume_id: str) -> dict[str, Any]:
        with self._lock:
            v = self._get(volume_id)
            if v.get("cluster_id"):
                raise _bad(
                    "volume_id",
                    f"volume {volume_id} is attached to cluster {v['cluster_id']}: delete the "
                    "cluster first",
                )
            del self._items[volume_id]
            self._save()
            return {"success": True}

    # ---- clusters ------------------------------------------------------------------------------
    def for_cluster(self, body: dict[str, Any], project: str) -> dict[str, Any] | None:
        """The volume a cluster create body asks for (checked, not yet bound), or None."""
        vid = body.get("volume_id")
        if vid is None:
            return None
        with self._lock:
            v = self._items.get(vid) if isinstance(vid, str) else None
            if v is None or v["project_id"] != project:
                raise _bad(
                    "volume_id",
                    f"no shared volume {str(vid)[:80]!r} in project {project}: create one with "
                    "clusters.storage.create(...) or give shared_volume instead",
                )
            if v.get("cluster_id"):
                raise _bad("volume_id", f"volume {vid} is already attached to {v['cluster_id']}")
            if body.get("region") and v["region"] != body["region"]:
                raise _bad(
                    "volume_id",
                    f"volume {vid} is in {v['region']}, the cluster in {body['region']}",
                )
            return self.to_api(v)

    def bind(self, volume_id: str, cluster_id: str, *, attached_only: bool) -> None:
        """`attached_only`: the volume existed before the cluster and outlives it."""
        with self._lock:
            v = self._get(volume_id)
            v["cluster_id"], v["status"] = cluster_id, "bound"
            v["attached_only"] = attached_only
            self._save()

    def release(self, cluster_id: str) -> None:
        """The cluster is gone: its volumes are free again, or deleted when they lived with it."""
        with self._lock:
            for vid, v in list(self._items.items()):
                if v.get("cluster_id") == cluster_id:
                    if v.get("is_lifecycle_independent") or v.get("attached_only"):
                        v["cluster_id"], v["status"] = None, "available"
                    else:
                        del self._items[vid]
            self._save()


__all__ = ["Volumes"]
