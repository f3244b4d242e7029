"""The catalogue's HTTP cases against the emulator, as data: one table per family of routes.

A case is ``(id, method, path, body, expected status)``; `body` is a JSON value, or `Raw` bytes
sent as they are. ``{cluster}`` in a path is an existing cluster's id. Adding a family of routes
is one more table in `TABLES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .conftest import FAKE_KEY

SEED: dict[str, Any] = {
    "cluster_name": "cat-cluster",
    "region": "us-central-2",
    "gpu_type": "RTX_6000_PCI",
    "cluster_type": "KUBERNETES",
    "num_gpus": 8,
    "billing_type": "ON_DEMAND",
    "nvidia_driver_version": "570",
    "cuda_version": "12.8",
}
BIG = 2**63
PROJECT = {"project_id": "proj-tgnb-emulator"}


@dataclass(frozen=True)
class Raw:
    data: bytes


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str
    body: Any = None
    status: int = 400
    auth: str | None = "key"  # "key": the emulator's key; None: no header; other: that header


def _create(**override: Any) -> dict[str, Any]:
    return {**SEED, **override}


_CREATE_BAD: dict[str, dict[str, Any]] = {
    "duration_days-object": {"duration_days": {"a": 1}},
    "duration_days-100k-string": {"duration_days": "A" * 100_000},
    "duration_days-negative": {"duration_days": -1},
    "duration_days-huge": {"duration_days": BIG},
    "duration_days-bool": {"duration_days": True},
    "project_id-list": {"project_id": ["p"]},
    "project_id-object": {"project_id": {"x": 1}},
    "project_id-int": {"project_id": 5},
    "project_id-newline": {"project_id": "p\nq"},
    "project_id-long": {"project_id": "p" * 300},
    "region-list": {"region": ["us-central-2"]},
    "region-object": {"region": {"a": 1}},
    "region-int": {"region": 5},
    "gpu_type-list": {"gpu_type": ["H100_SXM"]},
    "gpu_type-int": {"gpu_type": 5},
    "billing_type-list": {"billing_type": []},
    "cluster_type-object": {"cluster_type": {"a": 1}},
    "add_ons-int": {"add_ons": 5},
    "add_ons-string": {"add_ons": "x"},
    "add_ons-list-of-int": {"add_ons": [5]},
    "add_ons-name-list": {"add_ons": [{"name": ["x"]}]},
    "add_ons-config-int": {"add_ons": [{"name": "a", "config": 5}]},
    "add_ons-too-many": {"add_ons": [{"name": f"a{i}"} for i in range(40)]},
    "shared_volume-size-abc": {"shared_volume": {"volume_name": "v", "size_tib": "abc"}},
    "shared_volume-int": {"shared_volume": 5},
    "shared_volume-name-list": {"shared_volume": {"volume_name": ["v"]}},
    "shared_volume-size-huge": {"shared_volume": {"volume_name": "v", "size_tib": BIG}},
    "shared_volume-unknown": {"shared_volume": {"volume_name": "v", "evil": 1}},
    "num_gpus-2^63": {"num_gpus": BIG},
    "num_gpus-80000": {"num_gpus": 80_000},
    "num_gpus-float": {"num_gpus": 8.0},
    "num_gpus-string": {"num_gpus": "8"},
    "num_gpus-bool": {"num_gpus": True},
    "num_gpus-12": {"num_gpus": 12},
    "num_gpus-0": {"num_gpus": 0},
    "num_gpus-negative": {"num_gpus": -8},
    "num_gpus-list": {"num_gpus": [8]},
    "preemptible-2^63": {"num_preemptible_gpus": BIG, **PROJECT},
    "preemptible-2^63-multiple-of-8": {"num_preemptible_gpus": 8 * 2**60, **PROJECT},
    "preemptible-negative": {"num_preemptible_gpus": -8, **PROJECT},
    "preemptible-12": {"num_preemptible_gpus": 12, **PROJECT},
    "preemptible-string": {"num_preemptible_gpus": "16", **PROJECT},
    "preemptible-float": {"num_preemptible_gpus": 8.5, **PROJECT},
    "preemptible-bool": {"num_preemptible_gpus": True, **PROJECT},
    "preemptible-no-project": {"num_preemptible_gpus": 16},
    "reserved-negative": {"num_reserved_gpus": -8},
    "reserved-string": {"num_reserved_gpus": "x"},
    "capacity-pool-gpus-list": {"num_capacity_pool_gpus": [8]},
    "auto_scale_max-huge": {"auto_scale_max_gpus": BIG},
    "cluster_name-empty": {"cluster_name": ""},
    "cluster_name-yaml-injection": {
        "cluster_name": "a\n  cluster:\n    server: https://evil.example\n- name: b"
    },
    "cluster_name-long": {"cluster_name": "x" * 1000},
    "cluster_name-list": {"cluster_name": ["x"]},
    "cluster_name-int": {"cluster_name": 5},
    "cluster_name-space": {"cluster_name": "a b"},
    "cluster_name-u2028": {"cluster_name": "a\u2028b"},
    "cluster_name-nul": {"cluster_name": "a\x00b"},
    "cluster_name-trailing-newline": {"cluster_name": "ok\n"},
    "nvidia_version_id-int": {"nvidia_version_id": 5},
    "nvidia_version_id-list": {"nvidia_version_id": ["x"]},
    "nvidia_version_id-unknown": {"nvidia_version_id": "nope"},
    "cuda_version-list": {"cuda_version": [1]},
    "driver-object": {"nvidia_driver_version": {"a": 1}},
    "driver-unknown": {"nvidia_driver_version": "1"},
    "slurm_image-int": {"slurm_image": 5},
    "slurm_shm-negative": {"slurm_shm_size_gib": -1},
    "auto_scale-string": {"auto_scale": "yes"},
    "install_traefik-int": {"install_traefik": 1},
    "cluster_config-int": {"cluster_config": 5},
    "oidc_config-list": {"oidc_config": []},
    "acceptance-string": {"acceptance_tests_params": "x"},
    "reservation_start-int": {"reservation_start_time": 5},
    "reservation_end-list": {"reservation_end_time": ["x"]},
    "capacity_pool_id-int": {"capacity_pool_id": 5},
    "volume_id-object": {"volume_id": {"a": 1}},
    "unknown-field": {"evil_field": 1},
    "unknown-field-long-name": {"x" * 1000: 1},
    "secret-in-unknown-field": {"api_key": FAKE_KEY},
    "gpu-not-in-region": {"region": "eu-north-1", "gpu_type": "L40_PCIE"},
}

_DEEP = b"[" * 100_000 + b"]" * 100_000

CLUSTERS: list[Case] = [
    *(
        Case(f"create-{k}", "POST", "/v1/compute/clusters", _create(**v))
        for k, v in _CREATE_BAD.items()
    ),
    *(
        Case(f"create-missing-{k}", "POST", "/v1/compute/clusters", {**SEED, k: None})
        for k in ("cluster_name", "region", "gpu_type", "num_gpus", "billing_type")
    ),
    Case("create-not-json", "POST", "/v1/compute/clusters", Raw(b"not json")),
    Case("create-NaN", "POST", "/v1/compute/clusters", Raw(b"NaN")),
    Case("create-field-NaN", "POST", "/v1/compute/clusters", Raw(b'{"num_gpus": NaN}')),
    Case("create-Infinity", "POST", "/v1/compute/clusters", Raw(b'{"duration_days": Infinity}')),
    Case("create--Infinity", "POST", "/v1/compute/clusters", Raw(b'{"num_gpus": -Infinity}')),
    Case("create-depth-100000", "POST", "/v1/compute/clusters", Raw(_DEEP)),
    Case("create-depth-40", "POST", "/v1/compute/clusters", Raw(b'{"a":' * 40 + b"1" + b"}" * 40)),
    Case("create-list-body", "POST", "/v1/compute/clusters", [1, 2]),
    Case("create-string-body", "POST", "/v1/compute/clusters", "x"),
    Case("create-null-body", "POST", "/v1/compute/clusters", Raw(b"null")),
    Case("create-bad-utf8", "POST", "/v1/compute/clusters", Raw(b'{"cluster_name": "\xff\xfe"}')),
    Case("create-form-body", "POST", "/v1/compute/clusters", Raw(b"api_key=x&password=y")),
    Case("create-2MB", "POST", "/v1/compute/clusters", Raw(b" " * (2 << 20)), 413),
    Case("create-no-key", "POST", "/v1/compute/clusters", SEED, 401, None),
    Case("create-wrong-key", "POST", "/v1/compute/clusters", SEED, 401, "Bearer " + FAKE_KEY),
    Case("create-basic-auth", "POST", "/v1/compute/clusters", SEED, 401, "Basic abc"),
    Case("create-no-key-10MB", "POST", "/v1/compute/clusters", Raw(b"{" * (10 << 20)), 401, None),
    Case("list-no-key", "GET", "/v1/compute/clusters", None, 401, None),
    Case("regions-no-key", "GET", "/v1/compute/regions", None, 401, None),
    Case("whoami-no-key", "GET", "/v3/whoami", None, 401, None),
    Case("projects-no-key", "GET", "/v1/projects", None, 401, None),
    Case("retrieve-unknown", "GET", "/v1/compute/clusters/nope", None, 404),
    Case("retrieve-long-id", "GET", "/v1/compute/clusters/" + "x" * 10_000, None, 404),
    Case("delete-unknown", "DELETE", "/v1/compute/clusters/nope", None, 404),
    Case("update-unknown", "PUT", "/v1/compute/clusters/nope", {"num_gpus": 8}, 404),
    Case("unknown-route", "GET", "/v1/nothing/here", None, 404),
    Case("unknown-route-patch", "PATCH", "/v1/compute/clusters", {}, 404),
    *(
        Case(f"update-{k}", "PUT", "/v1/compute/clusters/{cluster}", v)
        for k, v in {
            "preemptible-2^63": {"num_preemptible_gpus": BIG},
            "preemptible-string": {"num_preemptible_gpus": "16"},
            "preemptible-12": {"num_preemptible_gpus": 12},
            "preemptible-negative": {"num_preemptible_gpus": -8},
            "preemptible-bool": {"num_preemptible_gpus": True},
            "preemptible-float": {"num_preemptible_gpus": 8.5},
            "num_gpus-80000": {"num_gpus": 80_000},
            "num_gpus-0": {"num_gpus": 0},
            "cluster_type-list": {"cluster_type": ["K"]},
            "add_ons-int": {"add_ons": 5},
            "cluster_config-string": {"cluster_config": "x"},
            "reservation_end-int": {"reservation_end_time": 5},
            "unknown-field": {"cluster_name": "renamed"},
            "list-body": [],
            "deep-body": Raw(_DEEP),
            "NaN": Raw(b'{"num_gpus": NaN}'),
        }.items()
    ),
    Case("update-no-key", "PUT", "/v1/compute/clusters/{cluster}", {"num_gpus": 8}, 401, None),
    Case("delete-no-key", "DELETE", "/v1/compute/clusters/{cluster}", None, 401, None),
]

ADMIN: list[Case] = [
    Case("chaos-list", "POST", "/_emulator/chaos", []),
    Case("chaos-delay-Infinity", "POST", "/_emulator/chaos", Raw(b'{"delay_s": Infinity}')),
    Case("chaos-delay-1e308", "POST", "/_emulator/chaos", {"delay_s": 1e308}),
    Case("chaos-delay-negative", "POST", "/_emulator/chaos", {"delay_s": -1}),
    Case("chaos-delay-string", "POST", "/_emulator/chaos", {"delay_s": "5"}),
    Case("chaos-fraction-string", "POST", "/_emulator/chaos", {"fraction": "0.5"}),
    Case("chaos-fraction-bool", "POST", "/_emulator/chaos", {"fraction": True}),
    Case("chaos-fraction-2", "POST", "/_emulator/chaos", {"fraction": 2}),
    Case("chaos-fraction-NaN", "POST", "/_emulator/chaos", Raw(b'{"fraction": NaN}')),
    Case("chaos-kinds-string", "POST", "/_emulator/chaos", {"kinds": "429"}),
    Case("chaos-kinds-int", "POST", "/_emulator/chaos", {"kinds": [5]}),
    Case("chaos-kinds-unknown", "POST", "/_emulator/chaos", {"kinds": ["boom"]}),
    Case("chaos-seed-string", "POST", "/_emulator/chaos", {"seed": "x"}),
    Case("chaos-seed-float", "POST", "/_emulator/chaos", {"seed": 1.5}),
    Case("chaos-retry-negative", "POST", "/_emulator/chaos", {"retry_after_ms": -1}),
    Case("chaos-unknown", "POST", "/_emulator/chaos", {"evil": 1}),
    Case("chaos-no-key", "POST", "/_emulator/chaos", {"fraction": 1}, 401, None),
    Case("capacity-list", "POST", "/_emulator/capacity", []),
    Case("capacity-bool", "POST", "/_emulator/capacity", {"gpus": True}),
    Case("capacity-negative", "POST", "/_emulator/capacity", {"gpus": -8}),
    Case("capacity-string", "POST", "/_emulator/capacity", {"gpus": "8"}),
    Case("capacity-2^63", "POST", "/_emulator/capacity", {"gpus": BIG}),
    Case("capacity-cluster-int", "POST", "/_emulator/capacity", {"gpus": 8, "cluster_id": 5}),
    Case(
        "capacity-cluster-unknown",
        "POST",
        "/_emulator/capacity",
        {"gpus": 8, "cluster_id": "x"},
        404,
    ),
    Case("capacity-unknown-field", "POST", "/_emulator/capacity", {"x": 1}),
    Case("capacity-no-key", "POST", "/_emulator/capacity", {"gpus": 0}, 401, None),
    Case("preempt-list", "POST", "/_emulator/clusters/{cluster}/preempt", []),
    Case("preempt-node-int", "POST", "/_emulator/clusters/{cluster}/preempt", {"node": 5}),
    Case("preempt-node-list", "POST", "/_emulator/clusters/{cluster}/preempt", {"node": ["x"]}),
    Case(
        "preempt-node-unknown", "POST", "/_emulator/clusters/{cluster}/preempt", {"node": "x"}, 404
    ),
    Case(
        "preempt-standard-node",
        "POST",
        "/_emulator/clusters/{cluster}/preempt",
        {"node": "{standard}"},
    ),
    Case("preempt-cluster-unknown", "POST", "/_emulator/clusters/nope/preempt", {}, 404),
    Case("release-unknown", "POST", "/_emulator/clusters/{cluster}/nodes/x/release", None, 404),
    Case("nodes-unknown", "GET", "/_emulator/clusters/nope/nodes", None, 404),
    Case("health-no-key", "GET", "/_emulator/health", None, 401, None),
    Case("requests-no-key", "GET", "/_emulator/requests", None, 401, None),
    Case("admin-2MB", "POST", "/_emulator/chaos", Raw(b" " * (2 << 20)), 413),
    Case("admin-deep", "POST", "/_emulator/chaos", Raw(_DEEP)),
]

_RL = "/v1/rl/model-resources"
_TINY = "tgnb/tiny-llama"
_RL_CREATE_BAD: dict[str, Any] = {
    "list": [],
    "base_model-unknown": {"base_model": "nope/none", "lora_enabled": True},
    "base_model-int": {"base_model": 5},
    "base_model-missing": {},
    "inactive_timeout-low": {"base_model": _TINY, "inactive_timeout": 5},
    "inactive_timeout-string": {"base_model": _TINY, "inactive_timeout": "x"},
    "inactive_timeout-2^63": {"base_model": _TINY, "inactive_timeout": BIG},
    "lora_enabled-string": {"base_model": _TINY, "lora_enabled": "yes"},
    "generators-negative": {"base_model": _TINY, "compute_config": {"num_generator_replicas": -1}},
    "generators-2^63": {"base_model": _TINY, "compute_config": {"num_generator_replicas": BIG}},
    "compute_config-list": {"base_model": _TINY, "compute_config": [1]},
    "optimizer_config-unknown": {"base_model": _TINY, "optimizer_config": {"sgd": {}}},
}

#: The Post-Training routes (``/v1/rl/...``): bad creates, unknown ids, bodies too deep, too large
#: or not finite, and no key. Operations on a live session are in tests/posttraining.
POST_TRAINING: list[Case] = [
    *(Case(f"rl-create-{k}", "POST", _RL, v) for k, v in _RL_CREATE_BAD.items()),
    Case("rl-create-NaN", "POST", _RL, Raw(b'{"base_model": NaN}')),
    Case(
        "rl-create-Infinity", "POST", _RL, Raw(b'{"base_model": "x", "inactive_timeout": Infinity}')
    ),
    Case("rl-create-deep", "POST", _RL, Raw(_DEEP)),
    Case("rl-create-2MB", "POST", _RL, Raw(b" " * (2 << 20)), 413),
    Case("rl-create-no-key", "POST", _RL, {"base_model": _TINY}, 401, None),
    Case("rl-create-wrong-key", "POST", _RL, {"base_model": _TINY}, 401, f"Bearer {FAKE_KEY}"),
    Case("rl-resource-unknown", "GET", _RL + "/nope", None, 404),
    Case("rl-stop-unknown", "POST", _RL + "/nope/stop", None, 404),
    Case("rl-extend-unknown", "POST", _RL + "/nope/extend-expiry", {"seconds": 60}, 404),
    Case("rl-session-list-body", "POST", "/v1/rl/training-sessions", []),
    Case("rl-session-resource-int", "POST", "/v1/rl/training-sessions", {"model_resources_id": 5}),
    Case(
        "rl-session-resource-unknown",
        "POST",
        "/v1/rl/training-sessions",
        {"model_resources_id": "nope"},
        404,
    ),
    Case("rl-session-unknown", "GET", "/v1/rl/training-sessions/nope", None, 404),
    Case("rl-session-stop-unknown", "POST", "/v1/rl/training-sessions/nope/stop", None, 404),
    Case(
        "rl-op-session-unknown",
        "POST",
        "/v1/rl/training-sessions/nope/operations/forward-backward",
        {},
        404,
    ),
    Case("rl-op-kind-unknown", "POST", "/v1/rl/training-sessions/nope/operations/evil", {}, 404),
    Case(
        "rl-upload-session-unknown",
        "POST",
        "/v1/rl/training-sessions/nope/payloads/upload-url",
        None,
        404,
    ),
    Case("rl-checkpoint-unknown", "GET", "/v1/rl/checkpoints/nope", None, 404),
    Case("rl-download-unknown", "GET", "/v1/rl/checkpoints/nope/download", None, 404),
    Case("rl-blob-unknown", "PUT", "/rl-blobs/nope", {"samples": []}, 404, None),
    Case("rl-file-unknown", "GET", "/rl-files/nope/adapter_model.safetensors", None, 404, None),
    Case("rl-supported-models-no-key", "GET", "/v1/rl/supported-models", None, 401, None),
]

#: Every family of routes.
TABLES: dict[str, list[Case]] = {
    "clusters": CLUSTERS,
    "admin": ADMIN,
    "post-training": POST_TRAINING,
}
ALL: list[Case] = [c for table in TABLES.values() for c in table]
