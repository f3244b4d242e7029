"""An API client from a cluster's ``kube_config`` field (base64 of a kubeconfig YAML).

The client gets its own `Configuration`; the ``kubernetes`` package's global default is never
touched, so several clusters can be attached in one kernel. Credentials in the kubeconfig (tokens,
client keys, passwords) are registered with `tgnb.config.register_secret`, so no tgnb message can
show them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Mapping
from typing import Any

import yaml

from tgnb.config import register_secret
from tgnb.errors import BackendError

_SECRET_FIELDS = ("token", "password", "client-key-data")


def decode_kube_config(kube_config: str | bytes | None, cluster: str = "") -> dict[str, Any]:
    """The kubeconfig mapping in `kube_config` (base64; plain YAML is accepted too).

    Raises `BackendError` with a one-line message when it is empty or not a kubeconfig.
    """
    where = f" of cluster {cluster!r}" if cluster else ""
    raw = kube_config.decode("ascii", "replace") if isinstance(kube_config, bytes) else kube_config
    if raw is None or not raw.strip():
        raise BackendError(
            f"the kube_config{where} is empty: wait until the cluster is Ready "
            "(a Kubernetes cluster gets its kubeconfig once its control plane is up)"
        )
    text = raw.strip()
    if not _looks_like_yaml(text):
        try:
            text = base64.b64decode("".join(text.split()), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise BackendError(
                f"the kube_config{where} is not base64 or YAML: read it again from the cluster "
                "(`tg clusters get-credentials` decodes the same field)"
            ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        raise BackendError(
            f"the kube_config{where} is not valid YAML: read it again from the cluster"
        ) from None
    if not isinstance(data, Mapping) or not data.get("clusters") or not data.get("contexts"):
        raise BackendError(
            f"the kube_config{where} has no clusters or contexts: it is not a kubeconfig"
        )
    _register_credentials(data)
    return dict(data)


def _looks_like_yaml(text: str) -> bool:
    """Base64 has no ':' (a kubeconfig's YAML always has); both may be wrapped over lines."""
    return ":" in text


def _register_credentials(data: Mapping[str, Any]) -> None:
    for entry in data.get("users") or []:
        user = entry.get("user") if isinstance(entry, Mapping) else None
        if not isinstance(user, Mapping):
            continue
        for key in _SECRET_FIELDS:
            value = user.get(key)
            if isinstance(value, str):
                register_secret(value)
                if key.endswith("-data"):
                    with contextlib.suppress(binascii.Error, ValueError):
                        register_secret(base64.b64decode(value).decode("utf-8", "replace"))


def api_client_from_kube_config(
    kube_config: str | bytes | None, *, context: str | None = None, cluster: str = ""
) -> Any:
    """A `kubernetes.client.ApiClient` with a dedicated `Configuration` built from `kube_config`."""
    from kubernetes import client, config

    data = decode_kube_config(kube_config, cluster)
    configuration = client.Configuration()
    try:
        config.load_kube_config_from_dict(
            data, context=context, client_configuration=configuration, persist_config=False
        )
    except (config.ConfigException, ValueError, TypeError, KeyError) as exc:
        where = f" of cluster {cluster!r}" if cluster else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendError(f"the kube_config{where} cannot be used: {first}") from None
    return client.ApiClient(configuration=configuration)


def context_namespace(kube_config: str | bytes | None, context: str | None = None) -> str:
    """The namespace of the kubeconfig's (current) context, ``"default"`` when it names none."""
    data = decode_kube_config(kube_config)
    wanted = context or data.get("current-context")
    for entry in data.get("contexts") or []:
        if isinstance(entry, Mapping) and entry.get("name") == wanted:
            ctx = entry.get("context") or {}
            return str(ctx.get("namespace") or "default")
    return "default"
