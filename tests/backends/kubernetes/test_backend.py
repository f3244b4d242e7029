"""`KubernetesBackend` against a fake API server on 127.0.0.1.

Every test here fakes the Kubernetes API server, because none can run on these machines (no
kube-apiserver, kind, k3s or Docker engine): the real ``kubernetes`` client sends real HTTP to a
small server (conftest.py) that records the requests and answers with minimal valid JSON.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from tgnb.backends.base import Backend, JobState, Resources, RunSpec, SecretRef
from tgnb.backends.kubernetes.backend import KubernetesBackend
from tgnb.config import register_secret
from tgnb.errors import AuthenticationError, BackendError, NotFoundError, ValidationError
from tgnb.events import BUDGET_REACHED, STDOUT_PREFIX, Event, utcnow
from tgnb.runs.recovery import RecoveryPolicy

NS = "research"
TRAIN = {
    "algorithm": "grpo",
    "model": "tgnb/tiny",
    "dataset": "arithmetic",
    "max_steps": 100,
    "checkpoint": {"every_steps": 10, "keep_last": 2},
}
SECRETS = {"HF_TOKEN": SecretRef(name="hf", key="token"), "WANDB_API_KEY": SecretRef(name="wandb")}
SINGLE = RunSpec(
    name="grpo-tiny",
    train=TRAIN,
    image="ghcr.io/example/tgnb:0.1",
    resources=Resources(nodes=1, gpus_per_node=1, preemptible=True),
    env={"HF_HUB_OFFLINE": "1"},
    secrets=SECRETS,
)
TWO = RunSpec(
    name="grpo-2n",
    train=TRAIN,
    image="ghcr.io/example/tgnb:0.1",
    resources=Resources(nodes=2, gpus_per_node=8, preemptible=True, memory_gib=512),
    secrets=SECRETS,
)
CM = f"/api/v1/namespaces/{NS}/configmaps"
PVC = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
SVC = f"/api/v1/namespaces/{NS}/services"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"


def golden(k8s: Any, name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((k8s.golden / f"{name}.yaml").read_text()))


def launched_as_golden(bodies: list[Any], since: float) -> list[Any]:
    """`bodies` with the ConfigMap's run file launched when the golden files say (1.8e9): a
    submit writes its own launch time, checked here to lie between `since` and now."""
    config_map = bodies[0]
    run = json.loads(config_map["data"]["run.json"])
    assert since <= run["launched"] <= time.time(), run["launched"]
    text = json.dumps({**run, "launched": 1.8e9}, indent=1, sort_keys=True) + "\n"
    return [{**config_map, "data": {**config_map["data"], "run.json": text}}, *bodies[1:]]


def backend(api_client: Any) -> KubernetesBackend:
    return KubernetesBackend(api_client, NS, poll_interval=0.01)


def test_is_a_backend(api_client: Any) -> None:
    """Fakes the API server (none can run here); only checks the protocol's shape."""
    assert isinstance(backend(api_client), Backend)


def test_submit_single_node_posts_the_golden_objects(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): the real client's POST bodies equal the golden
    objects, in order ConfigMap, claim, Job, with a bearer token on every request."""
    since = time.time()
    job_id = backend(api_client).submit(SINGLE)
    assert job_id == "grpo-tiny"
    posts = fake_api.sent("POST")
    assert [r.path for r in posts] == [CM, PVC, JOBS]
    bodies = launched_as_golden([r.body for r in posts], since)
    assert bodies == golden(k8s, "single_preemptible")
    assert all(r.headers["authorization"] == "Bearer test-token-not-secret" for r in posts)


def test_submit_two_nodes_adds_the_headless_service(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): Indexed Job plus headless Service on the wire."""
    since = time.time()
    backend(api_client).submit(TWO)
    posts = fake_api.sent("POST")
    assert [r.path for r in posts] == [CM, PVC, SVC, JOBS]
    assert launched_as_golden([r.body for r in posts], since) == golden(k8s, "two_node")


def test_secrets_reach_the_wire_only_as_secret_key_refs(
    fake_api: Any, api_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fakes the API server (none can run here): a token present in the submitting environment
    never appears in any request; the pod gets it through secretKeyRef only."""
    value = "hf_wire-check-token-value-42"
    monkeypatch.setenv("HF_TOKEN", value)
    register_secret(value)
    backend(api_client).submit(TWO)
    for req in fake_api.requests:
        assert value not in json.dumps(req.body)
    job = fake_api.sent("POST")[-1].body
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in env
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "HF_TOKEN": {"name": "hf", "key": "token"},
        "WANDB_API_KEY": {"name": "wandb", "key": "WANDB_API_KEY"},
    }
    assert all("value" not in e for e in env if e["name"] in refs)


def test_an_existing_shared_claim_is_kept(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): 409 AlreadyExists on the claim is tolerated."""
    fake_api.route("POST", PVC, (409, k8s.status(409, "AlreadyExists", "tgnb-runs exists")))
    assert backend(api_client).submit(SINGLE) == "grpo-tiny"
    assert [r.path for r in fake_api.sent("POST")] == [CM, PVC, JOBS]
    assert fake_api.sent("DELETE") == []


def test_an_existing_run_name_is_refused_and_nothing_else_sent(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): 409 on the ConfigMap means the run exists."""
    fake_api.route("POST", CM, (409, k8s.status(409, "AlreadyExists", "exists")))
    with pytest.raises(BackendError, match="already exists in namespace 'research'") as info:
        backend(api_client).submit(TWO)
    assert "\n" not in str(info.value)
    assert [r.path for r in fake_api.requests] == [CM]


def test_a_refused_job_removes_what_was_created(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): the Job is refused (422); the run's ConfigMap and
    Service are deleted again, the shared claim is not."""
    fake_api.route(
        "POST", JOBS, (422, k8s.status(422, "Invalid", 'Job.batch "grpo-2n" is invalid: spec'))
    )
    with pytest.raises(BackendError, match=r"answered 422: Job\.batch") as info:
        backend(api_client).submit(TWO)
    assert "\n" not in str(info.value)
    deleted = [r.path for r in fake_api.sent("DELETE")]
    assert deleted == [f"{SVC}/grpo-2n", f"{CM}/grpo-2n-config"]


def test_forbidden_is_an_authentication_error(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): 403 becomes a one-line AuthenticationError."""
    fake_api.route("POST", CM, (403, k8s.status(403, "Forbidden", "configmaps is forbidden")))
    with pytest.raises(AuthenticationError, match="refused to create the run's config") as info:
        backend(api_client).submit(SINGLE)
    assert "\n" not in str(info.value)


def test_image_missing_sends_nothing(fake_api: Any, api_client: Any) -> None:
    """Fakes the API server (none can run here): bad input is refused before any request."""
    spec = RunSpec(name="no-image", train=TRAIN)
    with pytest.raises(ValidationError) as info:
        backend(api_client).submit(spec)
    assert str(info.value).startswith("a Kubernetes run needs an image: pass image=...")
    with pytest.raises(ValidationError, match="start it with a letter"):
        backend(api_client).submit(RunSpec(name="9lives", train=TRAIN, image="i"))
    assert fake_api.requests == []


def test_unreachable_api_server_is_one_line(k8s: Any) -> None:
    """No API server at all: a port nothing listens on."""
    import socket

    from kubernetes import client

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.retries = 0
    api = client.ApiClient(configuration)
    try:
        with pytest.raises(BackendError, match="could not reach the Kubernetes API") as info:
            KubernetesBackend(api, NS).submit(SINGLE)
        assert "\n" not in str(info.value)
    finally:
        api.close()


# -- status -------------------------------------------------------------------------------------


def serve(fake_api: Any, k8s: Any, job: dict[str, Any], *pods: dict[str, Any]) -> None:
    fake_api.route("GET", f"{JOBS}/{job['metadata']['name']}", (200, job))
    fake_api.route("GET", PODS, (200, k8s.pods(*pods)))


def test_status_running(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here)."""
    serve(fake_api, k8s, k8s.job("grpo-tiny"), k8s.pod("grpo-tiny-0-a", run="grpo-tiny"))
    status = backend(api_client).status("grpo-tiny")
    assert status.state is JobState.RUNNING
    assert status.restart_count == 0
    assert status.nodes == ("gpu-preemptible-dp-1",)
    (pods_req,) = [r for r in fake_api.requests if r.path == PODS]
    assert pods_req.query["labelSelector"] == ["tgnb/run=grpo-tiny"]


def test_status_after_preemption_is_requeued_with_a_restart(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): the preempted pod exited 75 on its node and
    the replacement waits for a preemptible node; the counters say one ignored failure."""
    serve(
        fake_api,
        k8s,
        k8s.job("grpo-tiny"),
        k8s.pod("grpo-tiny-0-a", run="grpo-tiny", phase="Failed", exit_code=75),
        k8s.pod(
            "grpo-tiny-0-b",
            run="grpo-tiny",
            phase="Pending",
            node=None,
            created="2026-11-29T19:05:00Z",
            ignored=1,
            unschedulable="0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
        ),
    )
    status = backend(api_client).status("grpo-tiny")
    assert status.state is JobState.REQUEUED
    assert status.restart_count == 1
    assert status.exit_code == 75
    assert status.detail.startswith("Unschedulable: 0/3 nodes are available")
    assert backend(api_client).restart_count("grpo-tiny") == 1


def test_restart_count_survives_removed_pods(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): pods of removed nodes are gone, the Job
    controller's counters on the new pods still count them (index 0 twice, index 1 once)."""
    serve(
        fake_api,
        k8s,
        k8s.job("grpo-2n", completions=2),
        k8s.pod("grpo-2n-0-c", run="grpo-2n", index=0, ignored=2, failures=0),
        k8s.pod(
            "grpo-2n-1-b",
            run="grpo-2n",
            index=1,
            ignored=0,
            failures=1,
            node="gpu-preemptible-dp-2",
        ),
    )
    status = backend(api_client).status("grpo-2n")
    assert status.state is JobState.RUNNING
    assert status.restart_count == 3
    assert status.nodes == ("gpu-preemptible-dp-1", "gpu-preemptible-dp-2")


def test_status_finished(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): Complete and Failed conditions."""
    serve(fake_api, k8s, k8s.job("a", conditions=[k8s.condition("Complete")]),
          k8s.pod("a-0", run="a", phase="Succeeded", exit_code=0))  # fmt: skip
    done = backend(api_client).status("a")
    assert done.state is JobState.SUCCEEDED and done.exit_code == 0
    failed_job = k8s.job(
        "b", conditions=[k8s.condition("Failed", "FailedIndexes", "Job has failed indexes")]
    )
    serve(fake_api, k8s, failed_job, k8s.pod("b-0", run="b", phase="Failed", exit_code=1))
    failed = backend(api_client).status("b")
    assert failed.state is JobState.FAILED and failed.exit_code == 1
    assert failed.detail == "FailedIndexes: Job has failed indexes"
    # exit 77 with the node's BudgetReached in the pod's log (tgnb.train.budget): cancelled at
    # its budget, as locally; the same exit with no budget stop recorded is the program's own
    serve(fake_api, k8s, k8s.job("c", conditions=[k8s.condition("Failed", "PodFailurePolicy")]),
          k8s.pod("c-0", run="c", phase="Failed", exit_code=77))  # fmt: skip
    own = backend(api_client).status("c")
    assert (own.state, own.exit_code) == (JobState.FAILED, 77), own
    assert "no budget stop was recorded" in own.detail, own
    reached = Event(utcnow(), "run", BUDGET_REACHED, "budget reached at $1.02 of $1.00: stopping",
                    "gpu-preemptible-dp-1", "c", {"spent_usd": 1.02, "budget_usd": 1.0})  # fmt: skip
    log = f"step 1\n{STDOUT_PREFIX}{json.dumps({'kind': 'events', **reached.to_dict()})}\n"
    fake_api.route("GET", f"{PODS}/c-0/log", (200, log.encode()))
    stopped = backend(api_client).status("c")
    assert (stopped.state, stopped.exit_code) == (JobState.CANCELLED, 77), stopped
    assert stopped.detail == "budget reached at $1.02 of $1.00", stopped


def test_status_of_an_unknown_run(fake_api: Any, api_client: Any) -> None:
    """Fakes the API server (none can run here)."""
    with pytest.raises(NotFoundError, match="no run 'ghost' in namespace 'research'"):
        backend(api_client).status("ghost")


def test_cancel_deletes_in_the_foreground_and_keeps_the_claim(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): the Job goes with propagation Foreground, then
    its Service and ConfigMap; a run without a placer answers 404 for the placer's Deployment and
    ConfigMap, and nothing more is asked; a later status (the Job is gone) says cancelled."""
    b = backend(api_client)
    gone = (404, k8s.status(404, "NotFound", "not found"))
    fake_api.route("DELETE", f"{DEPLOYMENTS}/grpo-2n-placer", gone)
    fake_api.route("DELETE", f"{CM}/grpo-2n-placer", gone)
    b.cancel("grpo-2n")
    deletes = fake_api.sent("DELETE")
    assert [r.path for r in deletes] == [
        f"{JOBS}/grpo-2n",
        f"{SVC}/grpo-2n",
        f"{CM}/grpo-2n-config",
        f"{DEPLOYMENTS}/grpo-2n-placer",
        f"{CM}/grpo-2n-placer",
    ]
    job_delete = deletes[0]
    policy = job_delete.query.get("propagationPolicy", [None])[0] or (job_delete.body or {}).get(
        "propagationPolicy"
    )
    assert policy == "Foreground"
    assert b.status("grpo-2n").state is JobState.CANCELLED
    fake_api.route("DELETE", f"{JOBS}/ghost", (404, k8s.status(404, "NotFound", "not found")))
    with pytest.raises(NotFoundError, match="nothing to cancel"):
        b.cancel("ghost")


# -- logs and events ------------------------------------------------------------------------------


def record(reason: str, time: str, **data: Any) -> str:
    body = {
        "kind": "events",
        "time": time,
        "source": "run",
        "reason": reason,
        "message": "",
        "run": "grpo-tiny",
    }
    if data:
        body["data"] = data
    return STDOUT_PREFIX + json.dumps(body)


OLD_LOG = (
    "\n".join(
        [
            record("RunStarted", "2026-11-29T19:00:10Z"),
            "step 1 loss 0.5",
            STDOUT_PREFIX + json.dumps({"kind": "metrics", "step": 1, "time": 1.0, "loss": 0.5}),
            record("SignalReceived", "2026-11-29T19:02:00Z", signal="SIGTERM"),
            record("CheckpointSaved", "2026-11-29T19:02:30Z", step=7),
        ]
    )
    + "\n"
)
NEW_LOG = record("RunResumed", "2026-11-29T19:06:00Z", step=7) + "\nstep 8 loss 0.4\n"


def preempted_run(fake_api: Any, k8s: Any, job: dict[str, Any]) -> None:
    old = k8s.pod("grpo-tiny-0-a", run="grpo-tiny", phase="Failed", exit_code=75)
    new = k8s.pod(
        "grpo-tiny-0-b",
        run="grpo-tiny",
        node="gpu-preemptible-dp-7",
        created="2026-11-29T19:05:00Z",
        ignored=1,
    )
    serve(fake_api, k8s, job, new, old)
    fake_api.route("GET", f"{PODS}/grpo-tiny-0-a/log", (200, OLD_LOG.encode()))
    fake_api.route("GET", f"{PODS}/grpo-tiny-0-b/log", (200, NEW_LOG.encode()))


def test_logs_oldest_pod_first(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here)."""
    preempted_run(fake_api, k8s, k8s.job("grpo-tiny"))
    lines = list(backend(api_client).logs("grpo-tiny"))
    assert lines == OLD_LOG.splitlines() + NEW_LOG.splitlines()
    log_reqs = [r for r in fake_api.requests if r.path.endswith("/log")]
    assert all(r.query["container"] == ["trainer"] for r in log_reqs)


def test_follow_moves_on_to_the_replacement_pod(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): the first pod was preempted; following streams
    its log, waits while the replacement is pending, streams the replacement with follow=true,
    and stops once the Job is complete."""
    old = k8s.pod("grpo-tiny-0-a", run="grpo-tiny", phase="Failed", exit_code=75)
    pending = k8s.pod(
        "grpo-tiny-0-b",
        run="grpo-tiny",
        phase="Pending",
        node=None,
        created="2026-11-29T19:05:00Z",
        ignored=1,
    )
    running = k8s.pod(
        "grpo-tiny-0-b",
        run="grpo-tiny",
        node="gpu-preemptible-dp-7",
        created="2026-11-29T19:05:00Z",
        ignored=1,
    )
    calls = {"pods": 0}

    def pods(_req: Any) -> tuple[int, Any]:
        calls["pods"] += 1
        return 200, k8s.pods(old, pending if calls["pods"] <= 2 else running)

    def job(_req: Any) -> tuple[int, Any]:
        conditions = [k8s.condition("Complete")] if calls["pods"] >= 4 else []
        return 200, k8s.job("grpo-tiny", conditions=conditions)

    fake_api.route("GET", PODS, pods)
    fake_api.route("GET", f"{JOBS}/grpo-tiny", job)
    fake_api.route("GET", f"{PODS}/grpo-tiny-0-a/log", (200, OLD_LOG.encode()))
    fake_api.route("GET", f"{PODS}/grpo-tiny-0-b/log", (200, NEW_LOG.encode()))
    lines = list(backend(api_client).logs("grpo-tiny", follow=True))
    assert lines == OLD_LOG.splitlines() + NEW_LOG.splitlines()
    log_reqs = [r for r in fake_api.requests if r.path.endswith("/log")]
    assert [r.path.split("/")[-2] for r in log_reqs] == ["grpo-tiny-0-a", "grpo-tiny-0-b"]
    assert all(r.query["follow"] == ["true"] for r in log_reqs)


def test_events_preemption_notices_of_the_runs_nodes_and_run_records(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): TogetherPreemptionNotified events are listed
    cluster-wide with a field selector and kept only for the nodes the run's pods were on; the
    run's own records come from its pods' logs."""
    preempted_run(fake_api, k8s, k8s.job("grpo-tiny"))

    def event(name: str, node: str, kind: str = "Node") -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": kind, "name": node},
            "reason": "TogetherPreemptionNotified",
            "message": f"node {node} will be reclaimed in 300s",
            "type": "Warning",
            "firstTimestamp": "2026-11-29T19:01:59Z",
        }

    def scheduled(pod: str, node: str) -> dict[str, Any]:
        return {
            "metadata": {"name": f"{pod}.1", "namespace": NS},
            "involvedObject": {"kind": "Pod", "name": pod},
            "reason": "Scheduled",
            "message": f"Successfully assigned {NS}/{pod} to {node}",
            "type": "Normal",
        }

    def event_list(*items: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": list(items)}

    # a pod of this run whose node was removed (the pod went with it), and a pod of another run
    fake_api.route(
        "GET",
        f"/api/v1/namespaces/{NS}/events",
        event_list(
            scheduled("grpo-tiny-0-zzzzz", "gpu-preemptible-dp-3"),
            scheduled("grpo-tiny-2-0-abcde", "gpu-preemptible-dp-9"),
        ),
    )
    early = {**event("e4", "gpu-preemptible-dp-3"), "firstTimestamp": "2026-11-29T18:50:00Z"}
    fake_api.route(
        "GET",
        "/api/v1/events",
        event_list(
            event("e1", "gpu-preemptible-dp-1"),
            event("e2", "gpu-preemptible-dp-9"),
            event("e3", "gpu-preemptible-dp-1", "Pod"),
            early,
        ),
    )
    got = backend(api_client).events("grpo-tiny")
    (req,) = [r for r in fake_api.requests if r.path == "/api/v1/events"]
    assert req.query["fieldSelector"] == ["reason=TogetherPreemptionNotified"]
    namespaced = [r for r in fake_api.requests if r.path.endswith(f"{NS}/events")]
    assert sorted(r.query["fieldSelector"][0] for r in namespaced) == [
        "reason=RecoveryDecided",
        "reason=Scheduled",
    ]
    reasons = [(e.source, e.reason, e.node) for e in got]
    assert reasons == [
        ("cluster", "TogetherPreemptionNotified", "gpu-preemptible-dp-3"),
        ("run", "RunStarted", None),
        ("cluster", "TogetherPreemptionNotified", "gpu-preemptible-dp-1"),
        ("run", "SignalReceived", None),
        ("run", "CheckpointSaved", None),
        ("run", "RunResumed", None),
    ]
    notice = got[2]
    assert notice.run == "grpo-tiny" and "reclaimed" in notice.message
    assert got[4].data == {"step": 7}


def test_status_waiting_details(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): a pod that cannot pull its image is pending
    with the reason; one waiting the policy's backoff (its init container) says so; a pod in its drain window still runs and says where it is terminating; one
    index of two being replaced after a preemption is a requeue."""
    pulling = k8s.pod(
        "a-0-x", run="a", phase="Pending", waiting=("ImagePullBackOff", "Back-off pulling image")
    )
    serve(fake_api, k8s, k8s.job("a"), pulling)
    st = backend(api_client).status("a")
    assert (st.state, st.detail) == (JobState.PENDING, "ImagePullBackOff: Back-off pulling image")

    backing_off = k8s.pod("d-0-y", run="d", phase="Pending", failures=2,
                          waiting=("PodInitializing", ""))  # fmt: skip
    backing_off["status"]["initContainerStatuses"] = [
        {"name": "backoff", "image": "img", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"running": {"startedAt": "2026-11-29T19:05:00Z"}}}
    ]  # fmt: skip
    serve(fake_api, k8s, k8s.job("d"), backing_off)
    st = backend(api_client).status("d")
    assert st.detail == "failure 2 counted: waiting the recovery policy's backoff"

    draining = k8s.pod("b-0-x", run="b", terminating=True)
    serve(fake_api, k8s, k8s.job("b"), draining)
    st = backend(api_client).status("b")
    assert (st.state, st.detail) == (JobState.RUNNING, "terminating on gpu-preemptible-dp-1")

    serve(
        fake_api,
        k8s,
        k8s.job("c", completions=2),
        k8s.pod("c-0-x", run="c", index=0),
        k8s.pod(
            "c-1-x", run="c", index=1, phase="Failed", exit_code=1, node="gpu-preemptible-dp-2"
        ),
        k8s.pod(
            "c-1-y",
            run="c",
            index=1,
            phase="Pending",
            node=None,
            created="2026-11-29T19:05:00Z",
            ignored=1,
        ),
    )
    st = backend(api_client).status("c")
    assert (st.state, st.restart_count, st.nodes) == (
        JobState.REQUEUED,
        1,
        ("gpu-preemptible-dp-1",),
    )


def test_follow_ends_when_the_run_is_deleted(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): the Job and its pods vanish (deleted elsewhere)
    while following; following ends instead of failing."""
    fake_api.route("GET", PODS, (200, k8s.pods()))
    lines = list(backend(api_client).logs("gone", follow=True))
    assert lines == []


# -- the placer (a policy that waits before standard nodes, or a deadline) -------------------------

PLACED = RunSpec(
    name="grpo-std",
    train=TRAIN,
    image="ghcr.io/example/tgnb:0.1",
    resources=Resources(nodes=1, gpus_per_node=8, preemptible=True),
    recovery=RecoveryPolicy(when_short="standard", wait_s=600),
    secrets=SECRETS,
)
SA = f"/api/v1/namespaces/{NS}/serviceaccounts"
ROLES = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles"
ROLE_BINDINGS = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings"
CLUSTER_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
CLUSTER_BINDINGS = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


def test_submit_creates_the_placer_before_the_job(fake_api: Any, api_client: Any) -> None:
    """Fakes the API server (none can run here): the placer's RBAC, config and Deployment are
    posted after the run's ConfigMap and claim and before the Job, whose pods are gated."""
    backend(api_client).submit(PLACED)
    posts = fake_api.sent("POST")
    assert [r.path for r in posts] == [
        CM, PVC, SA, ROLES, ROLE_BINDINGS, CLUSTER_ROLES, CLUSTER_BINDINGS, CM, DEPLOYMENTS, JOBS
    ]  # fmt: skip
    assert [r.body["metadata"]["name"] for r in posts[2:9]] == [
        "grpo-std-placer", "grpo-std-placer", "grpo-std-placer", "tgnb-placer:research:grpo-std",
        "tgnb-placer:research:grpo-std", "grpo-std-placer", "grpo-std-placer",
    ]  # fmt: skip
    pod = posts[-1].body["spec"]["template"]["spec"]
    assert pod["schedulingGates"] == [{"name": "tgnb.together.ai/placement"}]


def test_a_refused_cluster_role_names_the_fix_and_leaves_nothing(
    fake_api: Any, api_client: Any, k8s: Any
) -> None:
    """Fakes the API server (none can run here): a user who may not create ClusterRoles gets one
    line naming `wait_s=0` or an admin; what was created is deleted again, no Job is sent."""
    fake_api.route(
        "POST", CLUSTER_ROLES, (403, k8s.status(403, "Forbidden", "clusterroles is forbidden"))
    )
    with pytest.raises(AuthenticationError, match=r"when_short='standard', wait_s=0\) without a deadline, or ask an admin") as info:  # fmt: skip
        backend(api_client).submit(PLACED)
    assert "\n" not in str(info.value)
    assert JOBS not in [r.path for r in fake_api.sent("POST")]
    assert [r.path for r in fake_api.sent("DELETE")] == [
        f"{ROLE_BINDINGS}/grpo-std-placer",
        f"{ROLES}/grpo-std-placer",
        f"{SA}/grpo-std-placer",
        f"{CM}/grpo-std-config",
    ]


def test_cancel_removes_the_placer(fake_api: Any, api_client: Any) -> None:
    """Fakes the API server (none can run here): after the Job, Service and ConfigMap, the
    placer's Deployment, ConfigMap, bindings, roles and ServiceAccount are deleted."""
    backend(api_client).cancel("grpo-std")
    assert [r.path for r in fake_api.sent("DELETE")] == [
        f"{JOBS}/grpo-std",
        f"{SVC}/grpo-std",
        f"{CM}/grpo-std-config",
        f"{DEPLOYMENTS}/grpo-std-placer",
        f"{CM}/grpo-std-placer",
        f"{ROLE_BINDINGS}/grpo-std-placer",
        f"{ROLES}/grpo-std-placer",
        f"{SA}/grpo-std-placer",
        f"{CLUSTER_BINDINGS}/tgnb-placer%3Aresearch%3Agrpo-std",
        f"{CLUSTER_ROLES}/tgnb-placer%3Aresearch%3Agrpo-std",
    ]


def test_events_include_the_placers_decisions(fake_api: Any, api_client: Any, k8s: Any) -> None:
    """Fakes the API server (none can run here): the placer's RecoveryDecided Events (label
    selector of the run) become tgnb events with the decision's fields, on the run's timeline."""
    serve(fake_api, k8s, k8s.job("grpo-std"))
    decision = {
        "metadata": {
            "name": "grpo-std-recovery-abcde",
            "namespace": NS,
            "labels": {"tgnb/run": "grpo-std"},
            "annotations": {
                "tgnb.together.ai/decision": json.dumps(
                    {"action": "start", "nodes": 1, "node_class": "standard", "rule": "standard"}
                )
            },
        },
        "involvedObject": {"kind": "Pod", "name": "grpo-std-0-aaaaa"},
        "reason": "RecoveryDecided",
        "message": "moved to 1 standard node: 0 of 8 preemptible GPUs allocated for 10 min",
        "type": "Normal",
        "firstTimestamp": "2026-11-29T19:10:00Z",
    }
    fake_api.route(
        "GET",
        f"/api/v1/namespaces/{NS}/events",
        (200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": [decision]}),
    )
    fake_api.route(
        "GET", "/api/v1/events", (200, {"kind": "EventList", "apiVersion": "v1", "items": []})
    )
    got = [e for e in backend(api_client).events("grpo-std") if e.reason == "RecoveryDecided"]
    assert [(e.source, e.run, e.message) for e in got] == [
        ("tgnb", "grpo-std", decision["message"])
    ]
    assert got[0].data == {
        "action": "start",
        "nodes": 1,
        "node_class": "standard",
        "rule": "standard",
    }
    (req,) = [
        r for r in fake_api.requests if r.query.get("fieldSelector") == ["reason=RecoveryDecided"]
    ]
    assert req.query["labelSelector"] == ["tgnb/run=grpo-std"]
