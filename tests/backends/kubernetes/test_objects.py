"""Kubernetes objects for a run: golden files, strict schema validation (1.30 and 1.37), the API
server's own cross-field rules for Jobs, placement, secrets and bad input.

Regenerate the golden files after a deliberate change with::

    TGNB_UPDATE_GOLDEN=1 python -m pytest tests/backends/kubernetes/test_objects.py
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tgnb.backends.base import EXIT_PREEMPTED, Resources, RunSpec, SecretRef
from tgnb.backends.kubernetes import restart_count_from_env
from tgnb.backends.kubernetes.objects import build_objects, command
from tgnb.config import register_secret
from tgnb.errors import ValidationError
from tgnb.prices import Prices
from tgnb.runs.budget import Budget
from tgnb.runs.node import BUDGET_ENV
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.runfile import RunFile

GOLDEN = Path(__file__).parent / "golden"
NS = "research"
VERSIONS = ("1.30", "1.37")
TRAIN = {
    "algorithm": "grpo",
    "model": "tgnb/tiny",
    "dataset": "arithmetic",
    "max_steps": 100,
    "checkpoint": {"every_steps": 10, "keep_last": 2},
}
SECRETS = {"HF_TOKEN": SecretRef(name="hf", key="token"), "WANDB_API_KEY": SecretRef(name="wandb")}

CASES: dict[str, RunSpec] = {
    "single_preemptible": RunSpec(
        name="grpo-tiny",
        train=TRAIN,
        image="ghcr.io/example/tgnb:0.1",
        resources=Resources(nodes=1, gpus_per_node=1, preemptible=True),
        env={"HF_HUB_OFFLINE": "1"},
        secrets=SECRETS,
    ),
    "two_node": RunSpec(
        name="grpo-2n",
        train=TRAIN,
        image="ghcr.io/example/tgnb:0.1",
        resources=Resources(nodes=2, gpus_per_node=8, preemptible=True, memory_gib=512),
        secrets=SECRETS,
    ),
    "standard": RunSpec(
        name="dpo-std",
        train={**TRAIN, "algorithm": "dpo", "dataset": "preferences"},
        image="ghcr.io/example/tgnb:0.1",
        resources=Resources(nodes=1, gpus_per_node=8, preemptible=False, cpus_per_task=32),
    ),
    # gated pods and the run's placer (`placer_objects`): standard nodes after 10 min short
    "placer": RunSpec(
        name="grpo-std",
        train=TRAIN,
        image="ghcr.io/example/tgnb:0.1",
        resources=Resources(nodes=2, gpus_per_node=8, preemptible=True),
        recovery=RecoveryPolicy(when_short="standard", wait_s=600),
        secrets=SECRETS,
    ),
    # TorchFT replica groups: an index per group and the lighthouse (tests/.../test_groups.py)
    "torchft_groups": RunSpec(
        name="ft-groups",
        train={"script": "train.py", "fault_tolerance": "torchft"},
        image="ghcr.io/example/tgnb-torchft:0.1",
        resources=Resources(nodes=3, gpus_per_node=8, preemptible=True),
        env={"TGNB_FT_HEARTBEAT_TIMEOUT_MS": "3000"},
        secrets={"HF_TOKEN": SecretRef(name="hf", key="token")},
    ),
}
#: The launch time in the placer's config (a fixed one, so the golden file is stable).
LAUNCHED = 1.8e9


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the training config) as literal blocks, so golden files read well."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dicts(name: str) -> list[dict[str, Any]]:
    return build_objects(CASES[name], NS, launched=LAUNCHED).to_dicts()


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_and_strict_schema(name: str) -> None:
    docs = dicts(name)
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    text = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False)
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("TGNB_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), (
        f"{path.name} differs: rerun with TGNB_UPDATE_GOLDEN=1 if meant"
    )


def test_strict_validation_rejects_an_unknown_field() -> None:
    job = dicts("two_node")[-1]
    job["spec"]["template"]["spec"]["terminationGracePeriod"] = 300  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, "1.30", strict=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_job_passes_the_api_servers_cross_field_rules(name: str) -> None:
    """Rules kube-apiserver checks beyond the schema (pkg/apis/batch/validation, 1.30)."""
    spec = CASES[name]
    docs = {d["kind"]: d for d in dicts(name)}
    job = docs["Job"]["spec"]
    pod = job["template"]["spec"]
    nodes = spec.resources.nodes
    # podFailurePolicy needs restartPolicy Never; backoffLimitPerIndex needs Indexed; with a pod
    # failure policy, pods are replaced only once fully terminated (Failed).
    assert pod["restartPolicy"] == "Never"
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == nodes
    assert 0 <= job["maxFailedIndexes"] <= job["completions"]
    assert job["podReplacementPolicy"] == "Failed"
    rules = job["podFailurePolicy"]["rules"]
    containers = {c["name"] for c in pod["containers"]}
    for rule in rules:
        assert rule["action"] in ("Ignore", "FailJob", "Count", "FailIndex")
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["containerName"] in containers
            assert 0 not in rule["onExitCodes"]["values"]
    assert {
        "action": "Ignore",
        "onPodConditions": [{"status": "True", "type": "DisruptionTarget"}],
    } in rules
    assert any(r.get("onExitCodes", {}).get("values") == [EXIT_PREEMPTED] for r in rules)
    assert pod["terminationGracePeriodSeconds"] == 300
    # pod host names are JOB-INDEX and must fit a DNS label
    assert len(f"{docs['Job']['metadata']['name']}-{nodes - 1}") <= 63
    # every label the template carries is a valid label value
    for value in job["template"]["metadata"]["labels"].values():
        assert len(value) <= 63
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["runs"]["mountPath"] == f"/data/runs/{spec.name}"
    assert mounts["runs"]["subPath"] == spec.name
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert {v["name"] for v in pod["volumes"]} >= set(mounts)


def test_two_node_rendezvous_wiring() -> None:
    docs = {d["kind"]: d for d in dicts("two_node")}
    job, svc = docs["Job"], docs["Service"]
    pod = job["spec"]["template"]["spec"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == svc["metadata"]["name"]
    selector = svc["spec"]["selector"]
    assert selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    argv = pod["containers"][0]["command"]
    assert argv[:3] == ["python", "-m", "tgnb.train.launch"]  # torchrun, keeping exit 75
    assert f"--rdzv_endpoint={job['metadata']['name']}-0.{svc['metadata']['name']}:29500" in argv
    assert "--nnodes=2" in argv and "--nproc_per_node=8" in argv
    assert "--node_rank=$(JOB_COMPLETION_INDEX)" in argv
    assert argv[-4:] == ["tgnb.train", "/config/run.json", "--run-dir", "/data/runs/grpo-2n"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"] == "290"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_placement_preemptible_and_standard() -> None:
    pre = dicts("single_preemptible")[-1]["spec"]["template"]["spec"]
    assert pre["nodeSelector"] == {"together.ai/compute-class": "preemptible"}
    assert "affinity" not in pre
    std = dicts("standard")[-1]["spec"]["template"]["spec"]
    assert "nodeSelector" not in std
    terms = std["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "together.ai/compute-class", "operator": "NotIn", "values": ["preemptible"]}
            ]
        }
    ]


def test_commands() -> None:
    assert command(CASES["single_preemptible"]) == [
        "python", "-m", "tgnb.train", "/config/run.json", "--run-dir", "/data/runs/grpo-tiny",
    ]  # fmt: skip
    assert command(CASES["standard"])[:6] == [
        "python", "-m", "tgnb.train.launch", "--standalone", "--nnodes=1", "--nproc_per_node=8",
    ]  # fmt: skip
    elastic = RunSpec(
        name="el", train={}, image="i", resources=Resources(nodes=4, min_nodes=2, gpus_per_node=8)
    )
    assert "--nnodes=2:4" in command(elastic)
    custom = RunSpec(name="c", train={}, image="i", run_dir="/data/home/me/runs/c")
    assert command(custom)[-1] == "/data/home/me/runs/c"


def test_secrets_only_as_secret_key_refs(monkeypatch: pytest.MonkeyPatch) -> None:
    value = "hf_Zx9-this-is-the-token-value"
    monkeypatch.setenv("HF_TOKEN", value)  # in the submitting environment, never in an object
    register_secret(value)
    docs = dicts("two_node")
    env = {e["name"]: e for e in docs[-1]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "wandb",
        "key": "WANDB_API_KEY",
    }
    assert "value" not in env["HF_TOKEN"] and "value" not in env["WANDB_API_KEY"]
    assert value not in yaml.safe_dump_all(docs)
    assert not any(d["kind"] == "Secret" for d in docs)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"image": None}, "a Kubernetes run needs an image: pass image=..."),
    ({"image": "  "}, "a Kubernetes run needs an image: pass image=..."),
    ({"image": "img :1"}, "contains whitespace"),
    ({"name": "1run"}, "start it with a letter"),
    ({"name": "Run_A"}, "is not valid"),
    ({"env": {"HF_TOKEN": "x"}}, "looks like a secret: pass it as secrets="),
    ({"env": {"TGNB_RUN": "x"}}, "is set by tgnb"),
    ({"env": {"1BAD": "x"}}, "is not valid"),
    ({"secrets": {"A": SecretRef(name="Not_Valid")}}, "not a valid Kubernetes name"),
    ({"env": {"A": "1"}, "secrets": {"A": SecretRef(name="a")}}, "both in env and in secrets"),
    ({"run_dir": "relative/dir"}, "cannot be mounted"),
    ({"resources": {"nodes": 0}}, "nodes must be at least 1"),
]


@pytest.mark.parametrize(("change", "expected"), BAD)
def test_bad_input_is_one_line(change: dict[str, Any], expected: str) -> None:
    base = {"name": "ok-run", "train": TRAIN, "image": "img:1"}
    with pytest.raises(ValidationError) as info:  # the spec, or its Resources, refuses it
        if isinstance(change.get("resources"), dict):
            change = {**change, "resources": Resources(**change["resources"])}
        build_objects(RunSpec(**{**base, **change}), NS)
    message = str(info.value)
    assert expected in message and "\n" not in message


def test_a_registered_secret_value_is_refused_anywhere() -> None:
    value = "sk-live-0123456789abcdef"
    register_secret(value)
    with pytest.raises(ValidationError, match="looks like a secret"):
        build_objects(RunSpec(name="r", train={}, image="i", env={"OPTS": value}), NS)
    with pytest.raises(ValidationError, match="training config holds a secret"):
        build_objects(RunSpec(name="r", train={"trl": {"tok": value}}, image="i"), NS)


def test_bad_namespace() -> None:
    with pytest.raises(ValidationError, match="namespace"):
        build_objects(CASES["standard"], "Bad_NS")


def test_restart_count_from_env() -> None:
    assert restart_count_from_env({}) == 0
    env = {"TGNB_INDEX_FAILURE_COUNT": "1", "TGNB_INDEX_IGNORED_FAILURE_COUNT": "2"}
    assert restart_count_from_env(env) == 3
    assert restart_count_from_env({"TGNB_INDEX_IGNORED_FAILURE_COUNT": ""}) == 0


def _script_spec(workdir: Path, **kw: Any) -> RunSpec:
    train = {"algorithm": "script", "script": "train.py", "args": ["--lr", "1e-4"]}
    return RunSpec(
        name="my-script",
        train=train,
        image="ghcr.io/example/tgnb:0.1",
        resources=Resources(nodes=1, gpus_per_node=8, preemptible=True),
        workdir=str(workdir),
        **kw,
    )


def test_a_script_run_ships_its_workdir_and_validates(tmp_path: Path) -> None:
    """A script run: the workdir snapshot rides in the ConfigMap, an init container unpacks it into
    the run directory, and the trainer runs the node contract's command; every object passes the
    strict schemas of both versions."""
    import base64
    import io
    import tarfile

    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "junk.pyc").write_bytes(b"x")
    docs = build_objects(_script_spec(tmp_path), NS).to_dicts()
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    tar = base64.b64decode(config_map["binaryData"]["workdir.tar.gz"])
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:gz") as t:
        assert sorted(t.getnames()) == ["pkg/__init__.py", "train.py"]
    pod = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    backoff, init = pod["initContainers"]  # the policy's backoff first (test_recovery_objects)
    assert backoff["name"] == "backoff"
    assert init["command"][:4] == ["python", "-m", "tarfile", "-e"]
    assert init["command"][-1] == "/data/runs/my-script/workdir", init["command"]
    trainer = pod["containers"][0]["command"]
    assert trainer[:3] == ["python", "-m", "tgnb.train.launch"] and "tgnb.train" in trainer
    assert "script: train.py" in config_map["data"]["config.yaml"]  # the view, for a person
    run = RunFile.from_dict(json.loads(config_map["data"]["run.json"]))  # what the node reads
    assert run.train.script == "train.py" and run.spec.name == "my-script"
    assert trainer[trainer.index("tgnb.train") + 1] == "/config/run.json"


def test_a_workdir_too_big_for_a_configmap_is_refused(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "weights.bin").write_bytes(os.urandom(900 * 1024))  # does not compress
    with pytest.raises(ValidationError) as info:
        build_objects(_script_spec(tmp_path), NS)
    assert ".tgnbignore" in str(info.value) and "\n" not in str(info.value)


def test_a_runs_budget_and_prices_reach_its_pods_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node holds a run's ``budget_usd`` (`tgnb.train.budget`): the pods of a script run
    (under the launcher) and of a built-in task read the budget, the launch's prices and the GPUs
    priced from the run file in the ConfigMap (not from `TGNB_BUDGET`), beside the secrets'
    references, and no secret value."""
    value = "hf_Zx9-this-is-the-token-value"
    monkeypatch.setenv("HF_TOKEN", value)
    register_secret(value)
    (tmp_path / "train.py").write_text("print('hi')\n")
    prices = Prices(standard=3.79, preemptible=1.895)
    spec = _script_spec(tmp_path, budget_usd=25, prices=prices, secrets=SECRETS)
    docs = build_objects(spec, NS).to_dicts()
    pod = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert BUDGET_ENV not in env
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    held = RunFile.from_dict(json.loads(config_map["data"]["run.json"])).budget()
    assert held is not None
    assert (held.budget_usd, held.gpus) == (25.0, 8)
    assert (held.prices.standard, held.prices.preemptible) == (3.79, 1.895)
    assert "value" not in env["HF_TOKEN"] and value not in yaml.safe_dump_all(docs)
    for doc in docs:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    builtin = dataclasses.replace(CASES["single_preemptible"], budget_usd=25, prices=prices)
    docs = build_objects(builtin, NS).to_dicts()
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    assert RunFile.from_dict(json.loads(config_map["data"]["run.json"])).budget() == Budget(
        25.0, prices, 1
    )
