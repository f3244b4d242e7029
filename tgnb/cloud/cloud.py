"""`Cloud`: the clusters API through the official SDK, with a project id. Attach, list, create, delete."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tgnb.cloud.client import (
    DEFAULT_SDK_RETRIES,
    DEFAULT_TIMEOUT,
    RetryPolicy,
    make_client,
    normalize_base_url,
)
from tgnb.cloud.cluster import Cluster
from tgnb.cloud.models import ClusterState
from tgnb.cloud.validate import check_gpus, check_name, check_target
from tgnb.config import Secret, Settings
from tgnb.errors import AmbiguousNameError, NotFoundError, ValidationError

if TYPE_CHECKING:
    from together import Together


class Cloud:
    """The clusters API for one key and (optionally) one project.

    Build it from the environment with ``Cloud()`` / ``Cloud.from_env()``, or pass `settings`.
    `timeout` and `max_retries` go to the SDK client; `retry` adds bounded retries on top for
    idempotent calls. `project_id` overrides the settings' project.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        project_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_SDK_RETRIES,
        retry: RetryPolicy | None = None,
        client: Together | None = None,
    ) -> None:
        settings = settings or Settings.from_env()
        if api_key is not None or base_url is not None or project_id is not None:
            settings = Settings(
                api_key=Secret(api_key) if api_key is not None else settings.api_key,
                base_url=base_url if base_url is not None else settings.base_url,
                project_id=project_id if project_id is not None else settings.project_id,
                home=settings.home,
            )
        self.settings = settings
        self.max_retries = max_retries
        self.retry = retry or RetryPolicy()
        self.client = client or make_client(settings, timeout=timeout, max_retries=max_retries)
        self.base_url = normalize_base_url(settings.base_url) or str(self.client.base_url)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **kwargs: Any) -> Cloud:
        return cls(Settings.from_env(env), **kwargs)

    @property
    def project_id(self) -> str | None:
        return self.settings.project_id

    def __repr__(self) -> str:
        return f"<Cloud {self.base_url} project={self.project_id or '-'}>"

    def close(self) -> None:
        """Close the SDK client's HTTP connections."""
        self.client.close()

    def __enter__(self) -> Cloud:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Any, what: str) -> Any:
        return self.retry.call(fn, what=what, base_url=self.base_url)

    # reads -------------------------------------------------------------------------------------
    def clusters(self) -> list[ClusterState]:
        """Every cluster the key can see (in the project, when one is set)."""
        clusters = self.client.clusters
        if self.project_id:
            raw = self._call(lambda: clusters.list(project_id=self.project_id), "list clusters")
        else:
            raw = self._call(lambda: clusters.list(), "list clusters")
        return [ClusterState.from_api(c) for c in raw.clusters]

    def attach(self, name_or_id: str) -> Cluster:
        """Attach to a cluster by id, else by name (one list request, no change made).

        A name shared by several clusters raises `AmbiguousNameError` listing their ids; no match
        raises `NotFoundError` listing the names available.
        """
        key = check_name(name_or_id)
        states = self.clusters()
        by_id = [s for s in states if s.id == key]
        if by_id:
            return Cluster(self, by_id[0])
        by_name = [s for s in states if s.name == key]
        if len(by_name) == 1:
            return Cluster(self, by_name[0])
        if len(by_name) > 1:
            ids = ", ".join(s.id for s in by_name)
            raise AmbiguousNameError(
                f"{len(by_name)} clusters are named {key!r} ({ids}): attach by id instead"
            )
        # Not in the (project-filtered) list: it may still be an id the key can read.
        try:
            raw = self._call(lambda: self.client.clusters.retrieve(key), f"read cluster {key}")
        except NotFoundError:
            pass
        else:
            return Cluster(self, ClusterState.from_api(raw))
        names = ", ".join(sorted({s.name for s in states})) or "none"
        scope = f" in project {self.project_id}" if self.project_id else ""
        raise NotFoundError(
            f"no cluster has the id or name {key!r}{scope}; clusters available: {names}"
        )

    # changes -----------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        *,
        region: str = "us-central-2",
        gpu_type: str = "H100_SXM",
        num_gpus: int = 8,
        preemptible: int = 0,
        cluster_type: str = "KUBERNETES",
        billing_type: str = "ON_DEMAND",
        cuda_version: str = "12.8",
        nvidia_driver_version: str = "570",
        **extra: Any,
    ) -> Cluster:
        """Create a cluster with `num_gpus` standard GPUs and a preemptible target.

        Checked before any request. Create is not idempotent: the SDK does not resend it; after a
        transient failure tgnb lists the clusters and adopts the new one if the create went
        through, and sends again only if it did not.
        """
        name = check_name(name, "cluster name")
        check_gpus(num_gpus)
        check_target(preemptible, self.project_id)
        if cluster_type not in ("KUBERNETES", "SLURM"):
            raise ValidationError(
                f"cluster_type must be KUBERNETES or SLURM, got {cluster_type!r}: pick one of the two"
            )
        body: dict[str, Any] = dict(
            cluster_name=name,
            region=region,
            gpu_type=gpu_type,
            num_gpus=num_gpus,
            cluster_type=cluster_type,
            billing_type=billing_type,
            cuda_version=cuda_version,
            nvidia_driver_version=nvidia_driver_version,
            num_preemptible_gpus=preemptible,
            **extra,
        )
        if self.project_id:
            body.setdefault("project_id", self.project_id)
        before = {s.id for s in self.clusters() if s.name == name}
        once = self.client.with_options(max_retries=0)

        def created() -> Cluster | None:
            new = [s for s in self.clusters() if s.name == name and s.id not in before]
            return Cluster(self, new[0]) if new else None

        return self.once_policy().call(
            lambda: Cluster(self, ClusterState.from_api(once.clusters.create(**body))),
            what=f"create cluster {name!r}",
            base_url=self.base_url,
            read_back=created,
        )

    def delete(self, cluster_id: str) -> None:
        """Delete a cluster by id. A retry that finds it already gone counts as done."""
        cluster_id = check_name(cluster_id, "cluster id")
        # The SDK does not retry here: after a lost answer, the resent DELETE meets a 404.
        once = self.client.with_options(max_retries=0)
        tries = {"n": 0}

        def delete_once() -> Any:
            tries["n"] += 1
            try:
                return once.clusters.delete(cluster_id)
            except Exception as exc:
                if tries["n"] > 1 and getattr(exc, "status_code", None) == 404:
                    return None  # an earlier try went through before its answer was lost
                raise

        self.once_policy().call(
            delete_once, what=f"delete cluster {cluster_id}", base_url=self.base_url
        )

    def once_policy(self) -> RetryPolicy:
        """The retries for a call sent with the SDK's own retries off (it must not be applied
        twice): as many tries in all as the SDK's and `retry`'s together."""
        return replace(self.retry, attempts=self.retry.attempts * (self.max_retries + 1))
