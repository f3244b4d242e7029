"""Kubernetes objects for one run, built with the ``kubernetes`` client's typed models.

A run is:

- a ConfigMap holding the training config, mounted as ``/config/run.yaml``;
- a ReadWriteMany PersistentVolumeClaim shared by all runs of a namespace (created if absent), each
  run mounting its own sub-directory at its run directory, so checkpoints outlive any pod;
- for several nodes, a headless Service (``publishNotReadyAddresses``) so that the pod of index 0
  is reachable as ``JOB-0.SERVICE`` for torchrun's c10d rendezvous before it is ready (replica
  groups have one too, for TorchFT's names: `groups.peer_service`);
- an Indexed Job (completions = parallelism = nodes) whose pods run ``python -m tgnb.train`` or
  torchrun. Workers go on preemptible nodes (``together.ai/compute-class: preemptible``), standard
  work is kept off them by the seed's NotIn affinity; pods claim the full 300 s drain window; the pod
  failure policy ignores disruptions and the runtime's "preempted, resume me" exit code, so the
  Job controller recreates the pod and the preemption does not count as a failure.

A policy that leaves preemptible nodes after a wait or by a deadline (`labels.needs_placer`) gives
the Job's pods a scheduling gate and no compute class: the run's placer
(`tgnb.backends.kubernetes.placer`, its objects in `placer_objects`) decides each placement with
`tgnb.runs.recovery.decide` and lifts the gate with the class chosen. Every policy is rendered.

Secrets reach pods only as ``env.valueFrom.secretKeyRef``; no secret value is ever in an object.
Only the Kubernetes fields that exist in 1.30 are used (podFailurePolicy, backoffLimitPerIndex and
podReplacementPolicy are beta and on by default there, GA later).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tgnb.backends.base import RunSpec
from tgnb.backends.kubernetes import groups
from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.placer_objects import PlacerObjects, build_placer, standard_affinity
from tgnb.config import MASK_VARS_ENV, scrub
from tgnb.errors import ValidationError
from tgnb.runs import node, placing, workdir
from tgnb.runs.recovery import FINAL_CODES
from tgnb.runs.runfile import RunFile


@dataclass(frozen=True)
class RunObjects:
    """Everything one run needs, in the order it is created."""

    config_map: client.V1ConfigMap
    claim: client.V1PersistentVolumeClaim
    service: client.V1Service | None
    job: client.V1Job
    placer: PlacerObjects | None = None
    #: a run as TorchFT replica groups: its lighthouse (`tgnb.backends.kubernetes.groups`)
    lighthouse: groups.LighthouseObjects | None = None

    def all(self) -> list[Any]:
        out: list[Any] = [self.config_map, self.claim]
        if self.service is not None:
            out.append(self.service)
        if self.placer is not None:  # before the Job: its pods wait for the placer
            out += self.placer.all()
        if self.lighthouse is not None:  # before the Job: its pods wait for the lighthouse
            out += self.lighthouse.all()
        out.append(self.job)
        return out

    def to_dicts(self) -> list[dict[str, Any]]:
        return [to_dict(obj) for obj in self.all()]


def to_dict(obj: Any) -> dict[str, Any]:
    """The JSON body the client sends for `obj` (camelCase keys, no None fields)."""
    data: dict[str, Any] = client.ApiClient().sanitize_for_serialization(obj)
    return data


def config_map_name(run: str) -> str:
    return f"{run}-config"


def run_labels(spec: RunSpec) -> dict[str, str]:
    return {
        L.MANAGED_BY_LABEL: L.MANAGED_BY,
        L.RUN_LABEL: spec.name,
        L.CLASS_LABEL: L.PREEMPTIBLE if spec.resources.preemptible else "standard",
    }


def render_config(spec: RunSpec) -> str:
    """The training config as YAML (``config.yaml``, a view of the run file for a person);
    refused if it holds a registered secret value."""
    return _no_secret(node.render_config(spec.train.compact()))


def render_run_file(spec: RunSpec, launched: float) -> str:
    """The run file (`tgnb.runs.runfile`): what the node reads, from the ConfigMap; refused if it
    holds a registered secret value."""
    return _no_secret(RunFile(spec, launched).to_json())


def _no_secret(text: str) -> str:
    if scrub(text) != text:
        raise ValidationError(
            "the training config holds a secret value: pass it through secrets=... instead"
        )
    return text


def literal(text: str) -> str:
    """`text` as the kubelet will pass it on: it expands ``$(VAR)`` in a container's command, args
    and env values, and reduces ``$$`` to ``$`` (its documented escape), so every ``$`` of a value
    tgnb did not write is doubled -- a run_dir holding ``$(HF_TOKEN)`` stays those characters."""
    return text.replace("$", "$$")


def command(spec: RunSpec) -> list[str]:
    """The trainer container's command (`tgnb.runs.node.command`): one process, or torchrun
    through tgnb's launcher, as the one process model says (`tgnb.runs.node.processes`: one
    process per GPU of the pod, its ``nvidia.com/gpu`` limit; a command once per pod). Only
    tgnb's own ``$(JOB_COMPLETION_INDEX)`` is expanded by the kubelet; the rest is `literal`."""
    res = spec.resources
    config, run_dir = f"{L.CONFIG_DIR}/{L.RUN_FILE}", literal(L.run_dir_for(spec))
    model = node.processes(spec.train, res.nodes, res.gpus_per_node)
    if not model.torchrun:
        return node.command("python", config, run_dir)
    if res.nodes == 1:
        return node.command("python", config, run_dir, node.standalone(model.nproc))
    shrink = spec.policy.when_short == "shrink" and res.min_nodes
    nnodes = f"{res.min_nodes}:{res.nodes}" if shrink else str(res.nodes)
    torchrun = [
        f"--nnodes={nnodes}",
        f"--nproc_per_node={model.nproc}",
        "--node_rank=$(JOB_COMPLETION_INDEX)",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={spec.name}-0.{spec.name}:{L.RDZV_PORT}",
        f"--rdzv_id={spec.name}",
        f"--max_restarts={spec.policy.max_restarts}",  # the policy's budget
    ]
    return node.command("python", config, run_dir, torchrun)


def _field_env(name: str, path: str) -> client.V1EnvVar:
    return client.V1EnvVar(
        name=name,
        value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path=path)),
    )


def environment(spec: RunSpec) -> list[client.V1EnvVar]:
    """tgnb's own variables, the spec's plain ones, then secrets as secretKeyRef only."""
    env = [
        client.V1EnvVar(name="TGNB_RUN", value=spec.name),
        client.V1EnvVar(name="TGNB_BACKEND", value="kubernetes"),
        client.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
        _field_env("TGNB_NODE", "spec.nodeName"),
        _field_env("TGNB_POD", "metadata.name"),
        _field_env(L.ENV_INDEX_FAILURES, f"metadata.annotations['{L.INDEX_FAILURES_ANNOTATION}']"),
        _field_env(
            L.ENV_INDEX_IGNORED_FAILURES,
            f"metadata.annotations['{L.INDEX_IGNORED_FAILURES_ANNOTATION}']",
        ),
    ]
    if "tgnb.train.launch" in command(spec):  # torchrun: give its agent time to stop workers
        env.append(
            client.V1EnvVar(
                name="TORCH_ELASTIC_SHUTDOWN_TIMEOUT", value=str(L.TORCHRUN_SHUTDOWN_SECONDS)
            )
        )
    gpus = str(int(spec.resources.gpus_per_node))  # the node meters itself (tgnb.runs.meter)
    env.append(client.V1EnvVar(name=node.GPUS_ENV, value=gpus))  # a budget: in the run file
    env += [client.V1EnvVar(name=k, value=literal(str(v))) for k, v in sorted(spec.env.items())]
    if spec.secrets:  # their names, for the node to mask their values in what it writes
        env.append(client.V1EnvVar(name=MASK_VARS_ENV, value=",".join(sorted(spec.secrets))))
    for name, ref in sorted(spec.secrets.items()):
        selector = client.V1SecretKeySelector(name=ref.name, key=ref.key or name)
        env.append(
            client.V1EnvVar(name=name, value_from=client.V1EnvVarSource(secret_key_ref=selector))
        )
    return env


def placement(spec: RunSpec) -> tuple[dict[str, str] | None, client.V1Affinity | None]:
    """nodeSelector for preemptible workers, NotIn affinity for standard work (seed document).
    A preemptible run whose recovery policy is ``when_short="standard"`` prefers preemptible nodes
    (a preferred affinity of weight 100) and is placed on a standard node when none fits: every
    pod, the first and each one recreated after a preemption, asks the scheduler again, so a run
    moved to a standard node goes back at its next restart when preemptible capacity is there.
    A run with a placer (`labels.needs_placer`) has neither: its placer sets one on each pod."""
    if L.needs_placer(spec):
        return None, None
    if spec.resources.preemptible and spec.policy.when_short == "standard":
        prefer = client.V1PreferredSchedulingTerm(
            weight=100,
            preference=client.V1NodeSelectorTerm(
                match_expressions=[
                    client.V1NodeSelectorRequirement(
                        key=L.COMPUTE_CLASS_LABEL, operator="In", values=[L.PREEMPTIBLE]
                    )
                ]
            ),
        )
        affinity = client.V1Affinity(
            node_affinity=client.V1NodeAffinity(
                preferred_during_scheduling_ignored_during_execution=[prefer]
            )
        )
        return None, affinity
    if spec.resources.preemptible:
        return {L.COMPUTE_CLASS_LABEL: L.PREEMPTIBLE}, None
    return None, standard_affinity()


def pod_failure_policy(spec: RunSpec) -> client.V1PodFailurePolicy:
    """The recovery policy's rules: a disruption (eviction, drain, node removal) or a "resume me"
    exit code (75) is not a failure: recreate the pod, uncounted. An exit a restart cannot fix (bad
    config, disk full) fails the run at once; any other failure counts against
    ``backoffLimitPerIndex`` (`RecoveryPolicy.max_restarts`), and the pod that replaces it waits
    the policy's backoff first (`backoff_container`)."""
    policy = spec.policy
    final = sorted(FINAL_CODES - set(policy.resume_codes))
    return client.V1PodFailurePolicy(
        rules=[
            client.V1PodFailurePolicyRule(
                action="Ignore",
                on_pod_conditions=[
                    client.V1PodFailurePolicyOnPodConditionsPattern(
                        type="DisruptionTarget", status="True"
                    )
                ],
            ),
            client.V1PodFailurePolicyRule(
                action="Ignore",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name=L.CONTAINER, operator="In", values=list(policy.resume_codes)
                ),
            ),
            client.V1PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=client.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name=L.CONTAINER, operator="In", values=final
                ),
            ),
        ]
    )


def container(spec: RunSpec) -> client.V1Container:
    res = spec.resources
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    if res.gpus_per_node > 0:
        limits["nvidia.com/gpu"] = str(res.gpus_per_node)
    if res.cpus_per_task:
        requests["cpu"] = str(res.cpus_per_task)
    if res.memory_gib:
        requests["memory"] = limits["memory"] = f"{res.memory_gib}Gi"
    mounts = [
        client.V1VolumeMount(name="config", mount_path=L.CONFIG_DIR, read_only=True),
        client.V1VolumeMount(name="runs", mount_path=L.run_dir_for(spec), sub_path=spec.name),
    ]
    if res.gpus_per_node > 0:
        mounts.append(client.V1VolumeMount(name="dshm", mount_path="/dev/shm"))
    return client.V1Container(
        name=L.CONTAINER,
        image=spec.image,
        command=command(spec),
        env=environment(spec),
        resources=client.V1ResourceRequirements(limits=limits or None, requests=requests or None),
        volume_mounts=mounts,
    )


#: The workdir snapshot rides in the run's ConfigMap (binaryData): the whole ConfigMap must stay
#: under Kubernetes' 1 MiB, so the gzipped snapshot may take this much (base64 adds a third).
WORKDIR_KEY = "workdir.tar.gz"
#: In the run directory, per index: the failure count whose backoff was waited (`backoff_container`).
BACKOFF_FILE = ".tgnb-backoff"
MAX_WORKDIR_TAR = 700 * 1024


def workdir_tar(spec: RunSpec) -> bytes | None:
    """The gzipped snapshot of the run's workdir, or None; `ValidationError` when it cannot fit
    the ConfigMap that carries it."""
    snapshot = spec.workdir_snapshot()
    if snapshot is None:
        return None
    data = snapshot.tar()
    if len(data) > MAX_WORKDIR_TAR:
        raise ValidationError(
            f"the workdir snapshot is {len(data) // 1024} KiB gzipped; on Kubernetes it travels in "
            f"a ConfigMap, {MAX_WORKDIR_TAR // 1024} KiB at most: list data and outputs in "
            f"{workdir.IGNORE_FILE}, or put them on the cluster's shared volume"
        )
    return data


def unpack_container(spec: RunSpec) -> client.V1Container:
    """The init container that unpacks the workdir snapshot into the run directory (each pod
    start unpacks the same snapshot: restarts run what was launched)."""
    dest = literal(f"{L.run_dir_for(spec)}/{node.WORKDIR}")
    return client.V1Container(
        name="workdir",
        image=spec.image,
        command=["python", "-m", "tarfile", "-e", f"{L.CONFIG_DIR}/{WORKDIR_KEY}", dest],
        volume_mounts=[
            client.V1VolumeMount(name="config", mount_path=L.CONFIG_DIR, read_only=True),
            client.V1VolumeMount(name="runs", mount_path=L.run_dir_for(spec), sub_path=spec.name),
        ],
    )


def backoff_container(spec: RunSpec) -> client.V1Container | None:
    """The init container that honours `RecoveryPolicy.backoff_s`: after a counted failure the
    pod that replaces it sleeps the policy's delay for its index's failures so far (the Job
    controller's annotation; `tgnb.runs.placing.backoff_table` rendered), once per count (a file
    per index in the run directory keeps the count waited for, so a pod recreated after a
    preemption waits nothing). The Job controller's own delay (10 s, doubled, at most 6 min)
    comes first: Kubernetes has no setting for it. None when the policy never waits."""
    table = placing.backoff_table(spec.policy)
    if not any(table):
        return None
    failures = _field_env(
        L.ENV_INDEX_FAILURES, f"metadata.annotations['{L.INDEX_FAILURES_ANNOTATION}']"
    )
    done = f"{literal(L.run_dir_for(spec))}/{BACKOFF_FILE}-$(JOB_COMPLETION_INDEX)"
    delays = ",".join(placing.seconds(x) for x in table)
    return client.V1Container(
        name=L.BACKOFF_CONTAINER,
        image=spec.image,
        command=["python", "-m", "tgnb.runs.placing", "backoff", f"$({L.ENV_INDEX_FAILURES})",
                 delays, done],
        env=[failures, client.V1EnvVar(name="PYTHONUNBUFFERED", value="1")],
        volume_mounts=[
            client.V1VolumeMount(name="runs", mount_path=L.run_dir_for(spec), sub_path=spec.name)
        ],
    )  # fmt: skip


def volumes(spec: RunSpec, claim: str) -> list[client.V1Volume]:
    out = [
        client.V1Volume(
            name="config",
            config_map=client.V1ConfigMapVolumeSource(name=config_map_name(spec.name)),
        ),
        client.V1Volume(
            name="runs",
            persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(claim_name=claim),
        ),
    ]
    if spec.resources.gpus_per_node > 0:
        out.append(
            client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory"))
        )
    return out


def build_objects(
    spec: RunSpec,
    namespace: str,
    *,
    claim: str = L.DEFAULT_CLAIM,
    claim_size: str = L.DEFAULT_CLAIM_SIZE,
    storage_class: str | None = None,
    launched: float | None = None,
) -> RunObjects:
    """All objects of `spec` in `namespace`. Raises `ValidationError` first if the spec is bad.
    `launched`: the launch time (the run file's; the placer's deadline counts from it; default:
    now)."""
    L.validate_spec(spec, namespace, claim)
    launched = time.time() if launched is None else launched
    labels = run_labels(spec)
    nodes = spec.resources.nodes
    multi = nodes > 1
    snapshot = workdir_tar(spec)

    config_map = client.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=client.V1ObjectMeta(
            name=config_map_name(spec.name), namespace=namespace, labels=labels
        ),
        data={L.RUN_FILE: render_run_file(spec, launched), L.CONFIG_FILE: render_config(spec)},
        binary_data=None
        if snapshot is None
        else {WORKDIR_KEY: base64.b64encode(snapshot).decode()},
    )
    pvc = client.V1PersistentVolumeClaim(
        api_version="v1",
        kind="PersistentVolumeClaim",
        metadata=client.V1ObjectMeta(
            name=claim, namespace=namespace, labels={L.MANAGED_BY_LABEL: L.MANAGED_BY}
        ),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": claim_size}),
            storage_class_name=storage_class,
        ),
    )
    service = None
    if multi:
        service = groups.headless_service(spec, namespace, labels, ("rdzv", L.RDZV_PORT))
    node_selector, affinity = placement(spec)
    backoff = backoff_container(spec)  # the backoff first: it delays the pod's whole start
    init = ([backoff] if backoff else []) + ([unpack_container(spec)] if snapshot else [])
    pod = client.V1PodSpec(
        restart_policy="Never",
        termination_grace_period_seconds=L.GRACE_SECONDS,
        subdomain=spec.name if multi else None,
        node_selector=node_selector,
        affinity=affinity,
        scheduling_gates=[client.V1PodSchedulingGate(name=L.PLACEMENT_GATE)]
        if L.needs_placer(spec)
        else None,
        init_containers=init or None,
        containers=[container(spec)],
        volumes=volumes(spec, claim),
    )
    job = client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(
            name=spec.name,
            namespace=namespace,
            labels=labels,
            annotations={L.RUN_DIR_ANNOTATION: L.run_dir_for(spec)},
        ),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=nodes,
            parallelism=nodes,
            backoff_limit_per_index=spec.policy.max_restarts,  # failures; preemptions are ignored
            max_failed_indexes=0,
            pod_replacement_policy="Failed",
            pod_failure_policy=pod_failure_policy(spec),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=pod
            ),
        ),
    )
    placer = (
        build_placer(spec, namespace, labels, claim, launched) if L.needs_placer(spec) else None
    )
    objs = RunObjects(config_map=config_map, claim=pvc, service=service, job=job, placer=placer)
    if groups.is_groups(spec):  # one index per TorchFT replica group, and the lighthouse
        return groups.as_groups(objs, spec, namespace, command(groups.group_spec(spec)))
    return objs
