"""A run as TorchFT replica groups on Kubernetes (`tgnb.backends.kubernetes.groups`, issue 50):
an Indexed Job of groups on the preemptible nodes, each pod a one-node run whose index is its
replica group, reachable from the others by the names TorchFT advertises (a headless Service,
the pods' subdomain and DNS search path), and the lighthouse as a Deployment off the preemptible
nodes behind a Service.
Strict schema validation (1.30 and 1.37); the golden file is test_objects.py's case
``torchft_groups`` (golden/torchft_groups.yaml), the same run as `SPEC` here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import kubernetes_validate
import pytest

from tgnb.backends.base import Resources, RunSpec, SecretRef
from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.groups import LIGHTHOUSE_LABEL, WAIT_CONTAINER, lighthouse_name
from tgnb.backends.kubernetes.objects import build_objects
from tgnb.errors import ValidationError
from tgnb.runs import ft
from tgnb.runs.trainconfig import from_dict

NS = "research"
VERSIONS = ("1.30", "1.37")
SPEC = RunSpec(
    name="ft-groups",
    train=from_dict({"script": "train.py", "fault_tolerance": "torchft"}),
    image="ghcr.io/example/tgnb-torchft:0.1",
    resources=Resources(nodes=3, gpus_per_node=8, preemptible=True),
    env={ft.HEARTBEAT_TIMEOUT_ENV: "3000"},
    secrets={"HF_TOKEN": SecretRef(name="hf", key="token")},
)
NOT_PREEMPTIBLE = [
    {"matchExpressions": [{"key": L.COMPUTE_CLASS_LABEL, "operator": "NotIn", "values": ["preemptible"]}]}
]  # fmt: skip


def _docs() -> list[dict[str, Any]]:
    return build_objects(SPEC, NS, launched=1.8e9).to_dicts()


def test_valid_against_the_schemas() -> None:
    """(The golden file is test_objects.py's case ``torchft_groups``: this run.)"""
    for doc in _docs():
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_lighthouse_is_off_the_preemptible_nodes_behind_a_service() -> None:
    docs = _docs()
    kinds = [d["kind"] for d in docs]
    assert kinds.index("Deployment") < kinds.index("Job")  # created first: the groups wait for it
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith(
        "-lighthouse")]  # fmt: skip
    pod = deployment["spec"]["template"]
    affinity = pod["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == (
        NOT_PREEMPTIBLE
    )
    assert "nodeSelector" not in pod["spec"] and deployment["spec"]["replicas"] == 1
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"].get("clusterIP") != "None"  # one address, not a headless set
    assert L.RUN_LABEL not in pod["metadata"]["labels"]  # the run's status reads its groups only
    assert pod["metadata"]["labels"][LIGHTHOUSE_LABEL] == SPEC.name
    (container,) = pod["spec"]["containers"]
    assert container["command"][0] == "torchft_lighthouse"
    assert container["command"][-2:] == ["--bind", f"0.0.0.0:{ft.LIGHTHOUSE_PORT}"]
    assert "--heartbeat_timeout_ms" in container["command"]
    assert container["command"][container["command"].index("--heartbeat_timeout_ms") + 1] == "3000"
    assert service["spec"]["ports"][0]["port"] == ft.LIGHTHOUSE_PORT


def test_the_groups_are_an_indexed_job_on_preemptible_nodes() -> None:
    docs = _docs()
    job = next(d for d in docs if d["kind"] == "Job")["spec"]
    service = next(d for d in docs if d["metadata"]["name"] == lighthouse_name(SPEC.name))
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == 3
    assert job["podReplacementPolicy"] == "Failed" and job["backoffLimitPerIndex"] == 3
    ignore = {
        "action": "Ignore",
        "onPodConditions": [{"status": "True", "type": "DisruptionTarget"}],
    }
    assert ignore in job["podFailurePolicy"]["rules"]  # a preempted group's pod is recreated
    pod = job["template"]["spec"]
    assert pod["nodeSelector"] == {L.COMPUTE_CLASS_LABEL: L.PREEMPTIBLE}
    trainer = next(c for c in pod["containers"] if c["name"] == L.CONTAINER)
    argv = trainer["command"]
    assert argv[:6] == ["python", "-m", "tgnb.train.launch", "--standalone", "--nnodes=1",
                        "--nproc_per_node=8"]  # fmt: skip
    assert not any("rdzv" in word or "node_rank" in word for word in argv)
    env = {e["name"]: e for e in trainer["env"]}
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert env[ft.LIGHTHOUSE_ENV]["value"] == url
    assert env[ft.REPLICA_GROUP_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env[ft.NUM_GROUPS_ENV]["value"] == "3"
    assert set(ft.group_env("x", 0, 3)) <= set(env)  # every name of the contract
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"key": "token", "name": "hf"}
    (wait,) = [c for c in pod["initContainers"] if c["name"] == WAIT_CONTAINER]
    assert wait["command"][:2] == ["python", "-c"]
    compile(wait["command"][2], "<wait>", "exec")  # the program the pod runs parses
    assert f"'{service['metadata']['name']}', {ft.LIGHTHOUSE_PORT}" in wait["command"][2]


def _peers(docs: list[dict[str, Any]], run: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The groups' headless Service (named like the run) and the Job's pod template."""
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == run]
    job = next(d for d in docs if d["kind"] == "Job")
    return service, job["spec"]["template"]


def test_the_groups_reach_each_other_by_the_names_torchft_advertises() -> None:
    """TorchFT 0.2.0 tells the other groups where a group is by names: its ManagerServer and its
    checkpoint transport say ``socket.gethostname()`` (an Indexed Job's pod: ``JOB-i``), the
    cross-group store is torchrun's ``MASTER_ADDR`` (``--standalone``: ``socket.getfqdn()``).
    The pods get a headless Service (ready or not), their subdomain (the FQDN in /etc/hosts and
    in the cluster's DNS) and a search domain under which ``JOB-i`` is that FQDN."""
    docs = _docs()
    service, template = _peers(docs, SPEC.name)
    kinds = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert kinds.index(("Service", SPEC.name)) < kinds.index(("Job", SPEC.name))
    spec = service["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert spec["selector"] == {L.RUN_LABEL: SPEC.name} and spec["ports"]  # DNS wants a port
    assert spec["selector"].items() <= template["metadata"]["labels"].items()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert (
        not spec["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    house = next(d for d in docs if d["metadata"]["name"] == lighthouse_name(SPEC.name))
    assert not house["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    assert pod["subdomain"] == SPEC.name
    assert "dnsPolicy" not in pod  # ClusterFirst: the search domain is added to the cluster's
    assert "setHostnameAsFQDN" not in pod
    (search,) = pod["dnsConfig"]["searches"]
    assert search == f"{SPEC.name}.{NS}.svc.cluster.local"
    for index in range(SPEC.resources.nodes):
        host = f"{SPEC.name}-{index}"  # the Job controller's host name of index i
        assert f"{host}.{search}" == f"{host}.{pod['subdomain']}.{NS}.svc.cluster.local"


def test_the_longest_names_fit_dns() -> None:
    """The longest run name a spec accepts (50 characters) in the longest namespace (63): every
    name of the peers is within DNS's limits (63 per label, 253 in all), and the pod's FQDN is
    over the 64 characters ``setHostnameAsFQDN`` allows (why a search domain instead). A longer
    run name is refused before anything is built, as for every run."""
    name, namespace = "r" * 44 + "-group", "n" * 63
    spec = RunSpec(
        name=name,
        train=from_dict({"script": "train.py", "fault_tolerance": "torchft"}),
        image="img",
        resources=Resources(nodes=12, gpus_per_node=1),
    )
    docs = build_objects(spec, namespace).to_dicts()
    for doc in docs:
        for version in VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    service, template = _peers(docs, name)
    (search,) = template["spec"]["dnsConfig"]["searches"]
    host = f"{template['spec']['subdomain']}-{spec.resources.nodes - 1}"
    names = [service["metadata"]["name"], lighthouse_name(name), host, search]
    assert all(0 < len(label) <= 63 for n in names for label in n.split(".")), names
    assert len(search) <= 253 and len(f"{host}.{search}") > 64
    with pytest.raises(ValidationError, match="at most 50 characters"):
        build_objects(dataclasses.replace(spec, name=name + "x"), namespace)  # the spec refuses it


def test_a_run_without_fault_tolerance_has_no_lighthouse() -> None:
    plain = RunSpec(
        name="plain",
        train=from_dict({"script": "train.py"}),
        image="img",
        resources=Resources(nodes=2, gpus_per_node=8),
    )
    docs = build_objects(plain, NS).to_dicts()
    assert "Deployment" not in [d["kind"] for d in docs]
    job = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    assert job["subdomain"] == "plain"
    assert ft.REPLICA_GROUP_ENV not in {e["name"] for e in job["containers"][0]["env"]}


@pytest.mark.parametrize("nodes", [2, 5])
def test_the_index_is_within_the_groups(nodes: int) -> None:
    spec = RunSpec(
        name="ft-n",
        train=from_dict({"script": "train.py", "fault_tolerance": "torchft"}),
        image="img",
        resources=Resources(nodes=nodes, gpus_per_node=0),
    )
    job = next(d for d in build_objects(spec, NS).to_dicts() if d["kind"] == "Job")["spec"]
    assert job["completions"] == nodes
    trainer = job["template"]["spec"]["containers"][0]
    assert {e["name"]: e.get("value") for e in trainer["env"]}[ft.NUM_GROUPS_ENV] == str(nodes)
    assert "--nproc_per_node=1" in trainer["command"]


@pytest.mark.parametrize("gpus", [2, 4])
def test_a_group_of_several_processes_is_one_torchrun_of_its_own(gpus: int) -> None:
    """A group is its pod's processes (issue 50): one torchrun with one process per GPU of the
    pod and its own rendezvous, the contract in the container's env (every rank inherits it)."""
    spec = RunSpec(
        name="ft-k",
        train=from_dict({"script": "train.py", "fault_tolerance": "torchft"}),
        image="img",
        resources=Resources(nodes=2, gpus_per_node=gpus),
    )
    docs = build_objects(spec, NS).to_dicts()
    for doc in docs:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    pod = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    trainer = next(c for c in pod["containers"] if c["name"] == L.CONTAINER)
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    argv = trainer["command"]
    assert argv[3:6] == ["--standalone", "--nnodes=1", f"--nproc_per_node={gpus}"], argv
    assert not any("rdzv" in word or "node_rank" in word for word in argv)
    assert set(ft.group_env("x", 0, 2)) <= {e["name"] for e in trainer["env"]}


CM = f"/api/v1/namespaces/{NS}/configmaps"
PVC = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
SVC = f"/api/v1/namespaces/{NS}/services"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


def _patched(fake_api: Any) -> Any:
    """The API's answer to a merge patch: the object as created, with the patch's metadata."""

    def answer(req: Any) -> tuple[int, dict[str, Any]]:
        collection = req.path.rsplit("/", 1)[0]
        (created,) = [r.body for r in fake_api.sent("POST") if r.path == collection
                      and r.body["metadata"]["name"] == req.path.rsplit("/", 1)[-1]]  # fmt: skip
        meta = {**created["metadata"], **req.body["metadata"]}
        return 200, {**created, "metadata": meta}

    return answer


def test_submit_creates_the_lighthouse_first_and_the_job_owns_it(
    fake_api: Any, api_client: Any
) -> None:
    """Fakes the API server (none can run here): the groups' headless Service, then the
    lighthouse's Service and Deployment go before the groups' Job, then the Job is made the
    lighthouse's owner (Kubernetes deletes it with the Job); cancelling the run deletes the
    headless Service as a multi-node run's."""
    from tgnb.backends.kubernetes.backend import KubernetesBackend

    house = f"{SPEC.name}-lighthouse"
    for path in (f"{SVC}/{house}", f"{DEPLOYMENTS}/{house}"):
        fake_api.route("PATCH", path, _patched(fake_api))
    backend = KubernetesBackend(api_client, NS, poll_interval=0.01)
    backend.submit(SPEC)
    posts = fake_api.sent("POST")
    assert [r.path for r in posts] == [CM, PVC, SVC, SVC, DEPLOYMENTS, JOBS]
    assert posts[2].body["metadata"]["name"] == SPEC.name
    assert posts[2].body["spec"]["clusterIP"] == "None"
    assert posts[3].body["metadata"]["name"] == posts[4].body["metadata"]["name"] == house
    assert posts[5].body["spec"]["template"]["spec"]["subdomain"] == SPEC.name
    patches = fake_api.sent("PATCH")
    assert [r.path for r in patches] == [f"{SVC}/{house}", f"{DEPLOYMENTS}/{house}"]
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": SPEC.name, "uid": "u-1"}
    assert all(r.body == {"metadata": {"ownerReferences": [owner]}} for r in patches)
    backend.cancel(SPEC.name)
    deleted = [r.path for r in fake_api.sent("DELETE")]
    assert deleted[:2] == [f"{JOBS}/{SPEC.name}", f"{SVC}/{SPEC.name}"]


def test_a_refused_ownership_leaves_nothing(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server: the owner patch refused (403), the Job and what was created before it
    are deleted, and the error names what failed."""
    from tgnb.backends.kubernetes.backend import KubernetesBackend
    from tgnb.errors import TgnbError

    house = f"{SPEC.name}-lighthouse"
    fake_api.route("PATCH", f"{SVC}/{house}", (403, k8s.status(403, "Forbidden", "no patch")))
    with pytest.raises(TgnbError, match="owner of its lighthouse"):
        KubernetesBackend(api_client, NS, poll_interval=0.01).submit(SPEC)
    deleted = [r.path for r in fake_api.sent("DELETE")]
    assert f"{JOBS}/{SPEC.name}" in deleted
    made = {f"{SVC}/{SPEC.name}", f"{SVC}/{house}", f"{DEPLOYMENTS}/{house}"}
    assert made | {f"{CM}/{SPEC.name}-config"} <= set(deleted)
