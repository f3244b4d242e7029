"""Kubeconfig from a cluster's base64 ``kube_config`` field, into a dedicated client."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from tgnb.backends.kubernetes.backend import KubernetesBackend
from tgnb.backends.kubernetes.kubeconfig import (
    api_client_from_kube_config,
    context_namespace,
    decode_kube_config,
)
from tgnb.errors import BackendError

TOKEN = "kc-bearer-7f3a9e0c1d2b"


def kubeconfig(server: str, namespace: str | None = "research") -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": "together", "user": "me"}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "together", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": TOKEN}}],
        "contexts": [{"name": "together", "context": context}],
        "current-context": "together",
    }


def b64(data: dict[str, Any]) -> str:
    return base64.b64encode(yaml.safe_dump(data).encode()).decode()


def test_decode_base64_and_plain_yaml() -> None:
    data = kubeconfig("https://10.0.0.1:6443")
    assert decode_kube_config(b64(data)) == data
    assert decode_kube_config(yaml.safe_dump(data)) == data
    wrapped = "\n".join(b64(data)[i : i + 60] for i in range(0, len(b64(data)), 60))
    assert decode_kube_config(wrapped) == data
    assert context_namespace(b64(data)) == "research"
    assert context_namespace(b64(kubeconfig("https://x", namespace=None))) == "default"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "is empty: wait until the cluster is Ready"),
        ("", "is empty: wait until the cluster is Ready"),
        ("   ", "is empty"),
        ("%%%not-base64%%%", "is not base64 or YAML"),
        (base64.b64encode(b"just: a mapping").decode(), "has no clusters or contexts"),
        (base64.b64encode(b"clusters: [unclosed").decode(), "is not valid YAML"),
    ],
)
def test_empty_or_invalid_is_one_line(value: str | None, expected: str) -> None:
    with pytest.raises(BackendError) as info:
        api_client_from_kube_config(value, cluster="my-cluster")
    message = str(info.value)
    assert expected in message and "\n" not in message
    assert "my-cluster" in message


def test_unknown_context_is_one_line() -> None:
    with pytest.raises(BackendError, match="cannot be used: ") as info:
        api_client_from_kube_config(b64(kubeconfig("https://x")), context="nope")
    assert "\n" not in str(info.value)


def test_the_token_never_shows_in_a_message() -> None:
    decode_kube_config(b64(kubeconfig("https://x")))
    assert TOKEN not in str(BackendError(f"failed with token {TOKEN}"))


def test_dedicated_client_reaches_the_server_with_the_token(fake_api: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): the client built from the kube_config sends its
    bearer token to the kubeconfig's server, and the client library's global default
    configuration is left alone."""
    from kubernetes import client

    before = client.Configuration.get_default_copy().host
    fake_api.route("GET", "/apis/batch/v1/namespaces/research/jobs/r", (200, k8s.job("r")))
    fake_api.route("GET", "/api/v1/namespaces/research/pods", (200, k8s.pods()))
    backend = KubernetesBackend.from_kube_config(b64(kubeconfig(fake_api.url)), cluster="c1")
    try:
        assert backend.namespace == "research"
        assert backend.status("r").state.value == "pending"
        assert fake_api.requests[0].headers["authorization"] == f"Bearer {TOKEN}"
        assert client.Configuration.get_default_copy().host == before != fake_api.url
        assert TOKEN not in repr(backend)
    finally:
        backend.api_client.close()
