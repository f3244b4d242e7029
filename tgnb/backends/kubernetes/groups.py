"""A run as TorchFT replica groups on Kubernetes (``fault_tolerance="torchft"``, issue 50; the
contract is `tgnb.runs.ft`): the run's objects (`tgnb.backends.kubernetes.objects`) made into
groups, and the lighthouse's own objects.

- The groups are the run's Indexed Job, one index per group (``completions = parallelism =
  nodes``), each pod a one-node run (torchrun with its own rendezvous: `group_spec`), on the
  preemptible nodes by the run's node selector. ``REPLICA_GROUP_ID`` is the pod's completion
  index (the Job controller's annotation, through the downward API); a preempted group's pod is
  recreated by the Job controller under the same index (the pod failure policy ignores
  disruptions and exit 75), and joins by healing from a live peer.
- The groups find each other by the names TorchFT advertises (checked against TorchFT 0.2.0 and
  torch 2.13): the ManagerServer (the address the lighthouse hands a healing group) and the HTTP
  checkpoint transport (the weights of a heal) say ``socket.gethostname()``, the pod's host name
  ``RUN-i``; the store of the cross-group process group is torchrun's ``MASTER_ADDR``, which with
  ``--standalone`` (c10d rendezvous, no ``--local-addr``) is the agent's ``socket.getfqdn()``. So
  the Job's pods get what a multi-node run's get, a headless Service named like the run
  (`peer_service`) and ``subdomain`` = that Service -- the pod's ``/etc/hosts`` then maps its FQDN
  ``RUN-i.RUN.NS.svc.cluster.local``, getfqdn() gives it and the cluster's DNS resolves it -- and
  a DNS search domain ``RUN.NS.svc.cluster.local`` (`peer_dns`), so that the short ``RUN-i``
  resolves from every other pod (`peer_dns` says why not ``setHostnameAsFQDN``). Like the
  multi-node render's, the Service is created before the Job and deleted by `cancel`.
- The lighthouse is a Deployment of one pod (`LighthouseObjects`), kept off the preemptible nodes by
  the seed's NotIn affinity, and a ClusterIP Service, ``RUN-lighthouse``, the groups' address
  (``http://RUN-lighthouse:29510``). Its pods carry no run label, so the run's status reads only the
  groups. Each group's pod first waits until the lighthouse answers (an init container). Both are
  created before the Job and then owned by it (``ownerReferences``, set by the backend once the
  Job has its uid): Kubernetes deletes them with the Job.
- The image must have ``torchft`` (``pip install 'tgnb[torchft]'``: the package and its
  ``torchft_lighthouse``); tgnb cannot look inside it from here (docs/replica-groups.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes import client

from tgnb.backends.base import RunSpec
from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.placer_objects import standard_affinity
from tgnb.runs import ft

if TYPE_CHECKING:
    from tgnb.backends.kubernetes.objects import RunObjects

#: The label of the lighthouse's pod (its Service selects it): the run's name.
LIGHTHOUSE_LABEL = "tgnb/lighthouse"
LIGHTHOUSE_CONTAINER = "lighthouse"
#: The group pod's init container that waits for the lighthouse.
WAIT_CONTAINER = "wait-lighthouse"
#: The Job controller's annotation of a pod's completion index.
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
#: The cluster's DNS domain in the groups' search path (`peer_dns`): Kubernetes' default, the
#: kubelet's ``clusterDomain``; a cluster with another one would need it here.
CLUSTER_DOMAIN = "cluster.local"
#: The groups' headless Service's one port, nominal: a headless Service proxies nothing (the pods
#: reach each other directly on TorchFT's own, ephemeral, ports), but DNS servers may publish no
#: records for one without ports (kubernetes/dns#174).
PEERS_PORT = 29500


def is_groups(spec: RunSpec) -> bool:
    return spec.train.fault_tolerance == ft.TORCHFT


def group_spec(spec: RunSpec) -> RunSpec:
    """What each group's pod runs: the run on one node (its own torchrun rendezvous)."""
    res = dataclasses.replace(spec.resources, nodes=1, min_nodes=None)
    return dataclasses.replace(spec, resources=res)


def lighthouse_name(run: str) -> str:
    return f"{run}-lighthouse"


def lighthouse_url(spec: RunSpec) -> str:
    return ft.lighthouse_url(lighthouse_name(spec.name), ft.LIGHTHOUSE_PORT)


@dataclass(frozen=True)
class LighthouseObjects:
    """The lighthouse of a run as replica groups: its Service and its Deployment."""

    service: client.V1Service
    deployment: client.V1Deployment

    def all(self) -> list[Any]:
        return [self.service, self.deployment]


def build_lighthouse(spec: RunSpec, namespace: str) -> LighthouseObjects:
    """The lighthouse's Service and Deployment (one pod, off the preemptible nodes)."""
    name, port = lighthouse_name(spec.name), ft.LIGHTHOUSE_PORT
    selector = {LIGHTHOUSE_LABEL: spec.name}
    labels = {L.MANAGED_BY_LABEL: L.MANAGED_BY, **selector}
    command = ft.lighthouse_command(f"0.0.0.0:{port}", ft.lighthouse_options(spec.env))
    container = client.V1Container(
        name=LIGHTHOUSE_CONTAINER,
        image=spec.image,
        command=command,
        ports=[client.V1ContainerPort(name="lighthouse", container_port=port, protocol="TCP")],
        readiness_probe=client.V1Probe(
            tcp_socket=client.V1TCPSocketAction(port=port), period_seconds=2
        ),
        resources=client.V1ResourceRequirements(requests={"cpu": "500m", "memory": "512Mi"}),
    )
    deployment = client.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=client.V1DeploymentSpec(
            replicas=1,
            strategy=client.V1DeploymentStrategy(type="Recreate"),  # never two lighthouses
            selector=client.V1LabelSelector(match_labels=selector),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(affinity=standard_affinity(), containers=[container]),
            ),
        ),
    )
    service = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=client.V1ServiceSpec(
            selector=selector,
            ports=[client.V1ServicePort(name="lighthouse", port=port, protocol="TCP")],
        ),
    )
    return LighthouseObjects(service=service, deployment=deployment)


def group_environment(spec: RunSpec) -> list[client.V1EnvVar]:
    """The groups' contract (`tgnb.runs.ft.group_env`): the index from the pod's completion index,
    the lighthouse's Service as its URL."""
    out = []
    for name, value in ft.group_env(lighthouse_url(spec), 0, spec.resources.nodes).items():
        if name == ft.REPLICA_GROUP_ENV:
            index = client.V1ObjectFieldSelector(
                field_path=f"metadata.annotations['{INDEX_ANNOTATION}']"
            )
            source = client.V1EnvVarSource(field_ref=index)
            out.append(client.V1EnvVar(name=name, value_from=source))
        else:
            out.append(client.V1EnvVar(name=name, value=value))
    return out


def wait_container(spec: RunSpec) -> client.V1Container:
    """The init container that waits until the lighthouse's Service answers."""
    host, port = lighthouse_name(spec.name), ft.LIGHTHOUSE_PORT
    program = (
        "import socket, sys, time\n"
        "while True:\n"
        "    try:\n"
        f"        socket.create_connection(({host!r}, {port}), 2).close()\n"
        "        break\n"
        "    except OSError:\n"
        f"        print('tgnb: waiting for the lighthouse {host}:{port}', file=sys.stderr)\n"
        "        time.sleep(2)\n"
    )
    return client.V1Container(
        name=WAIT_CONTAINER, image=spec.image, command=["python", "-c", program]
    )


def headless_service(
    spec: RunSpec, namespace: str, labels: dict[str, str], port: tuple[str, int]
) -> client.V1Service:
    """The run's headless Service, named like the run (its Job's pods' ``subdomain``): it
    selects the run's pods (`labels.RUN_LABEL`; the lighthouse's and the placer's pods carry
    none) and publishes them before they are ready, so a pod is reachable as soon as it starts.
    `port` (name, number): a multi-node run's rendezvous, or the groups' `peer_service`'s."""
    return client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(name=spec.name, namespace=namespace, labels=labels),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={L.RUN_LABEL: spec.name},
            ports=[client.V1ServicePort(name=port[0], port=port[1], protocol="TCP")],
        ),
    )


def peer_service(spec: RunSpec, namespace: str, labels: dict[str, str]) -> client.V1Service:
    """The groups' headless Service: TorchFT's names of each group resolve through it."""
    return headless_service(spec, namespace, labels, ("peers", PEERS_PORT))


def peer_dns(spec: RunSpec, namespace: str) -> client.V1PodDNSConfig:
    """The groups' pods' DNS search path, added to the cluster's: ``RUN.NS.svc.CLUSTER_DOMAIN``,
    so the short host name TorchFT advertises, ``RUN-i``, resolves to the pod of group ``i``.

    Not ``setHostnameAsFQDN`` (which would make gethostname() the FQDN): the kubelet fails a pod
    whose FQDN is over 64 characters, and ``RUN-i.RUN.NS.svc.cluster.local`` is over 64 for
    names tgnb accepts (a run's name up to 50 characters, a namespace's up to 63). A
    search domain has no such limit (a DNS-1123 subdomain, 253), each of its labels (the run's
    name, the namespace) is within 63, and the pod's own name stays its short host name."""
    return client.V1PodDNSConfig(searches=[f"{spec.name}.{namespace}.svc.{CLUSTER_DOMAIN}"])


def as_groups(
    objs: RunObjects, spec: RunSpec, namespace: str, group_command: list[str]
) -> RunObjects:
    """`objs` of `spec` (built for its ``nodes``) made into replica groups: every pod a one-node
    run (`group_command`, the trainer's command of `group_spec`) with the groups' contract in its
    environment, after the lighthouse answers, reachable from the others by its host name and
    FQDN (`peer_service`, `peer_dns`); with the lighthouse's objects."""
    pod: Any = objs.job.spec.template.spec  # type: ignore[union-attr]  # built just before
    job_meta: Any = objs.job.metadata
    service = peer_service(spec, namespace, dict(job_meta.labels))  # the run's labels
    pod.subdomain = spec.name  # the Service's name
    pod.dns_config = peer_dns(spec, namespace)
    trainer = next(c for c in pod.containers if c.name == L.CONTAINER)
    trainer.command = group_command
    trainer.env = [*(trainer.env or []), *group_environment(spec)]
    pod.init_containers = [*(pod.init_containers or []), wait_container(spec)]
    lighthouse = build_lighthouse(spec, namespace)
    return dataclasses.replace(objs, service=service, lighthouse=lighthouse)
