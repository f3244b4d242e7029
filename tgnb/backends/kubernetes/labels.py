"""Names and rules a Kubernetes run lives by: labels, paths, limits and input checks.

This module does not import the ``kubernetes`` client, so the training runtime (which reads the
restart count from its environment) and the notebook side may use it freely.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tgnb.backends.base import RunSpec
from tgnb.errors import ValidationError
from tgnb.runs import node

#: The node label Together puts on preemptible nodes (seed document).
COMPUTE_CLASS_LABEL = "together.ai/compute-class"
PREEMPTIBLE = "preemptible"

#: The drain window: Together removes a reclaimed node at most five minutes after the notice.
GRACE_SECONDS = 300
#: torchrun waits this long for its workers to checkpoint after SIGTERM before it kills them
#: (its own default is 30 s, far shorter than the drain window).
TORCHRUN_SHUTDOWN_SECONDS = GRACE_SECONDS - 10

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "tgnb"
RUN_LABEL = "tgnb/run"
CLASS_LABEL = "tgnb/compute-class"
RUN_DIR_ANNOTATION = "tgnb/run-dir"

CONTAINER = "trainer"
#: The init container that waits the policy's backoff after a counted failure (`objects`).
BACKOFF_CONTAINER = "backoff"
CONFIG_DIR = "/config"
RUN_FILE = node.RUN_FILE  # the node contract's run file, mounted from the ConfigMap
CONFIG_FILE = node.CONFIG  # its view for a person, beside it
RUNS_ROOT = "/data/runs"
DEFAULT_CLAIM = "tgnb-runs"
DEFAULT_CLAIM_SIZE = "100Gi"
RDZV_PORT = 29500
# The restart budgets (backoffLimitPerIndex, torchrun's --max_restarts) come from the run's
# recovery policy (`tgnb.runs.recovery.RecoveryPolicy.max_restarts`).

#: Annotations the Job controller keeps on each pod of an Indexed Job with backoffLimitPerIndex:
#: counted failures and failures the pod failure policy ignored (preemptions) of that index.
INDEX_FAILURES_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED_FAILURES_ANNOTATION = "batch.kubernetes.io/job-index-ignored-failure-count"
#: The same two numbers as the pod sees them (downward API). Their sum is the restart count.
ENV_INDEX_FAILURES = "TGNB_INDEX_FAILURE_COUNT"
ENV_INDEX_IGNORED_FAILURES = "TGNB_INDEX_IGNORED_FAILURE_COUNT"

#: Environment variables tgnb sets in every trainer container; a RunSpec may not set them itself.
RESERVED_ENV = frozenset(
    {
        "TGNB_RUN",
        "TGNB_BACKEND",
        "TGNB_NODE",
        "TGNB_POD",
        ENV_INDEX_FAILURES,
        ENV_INDEX_IGNORED_FAILURES,
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
        "PYTHONUNBUFFERED",
        "JOB_COMPLETION_INDEX",
    }
)

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def restart_count_from_env(env: Mapping[str, str]) -> int:
    """The restart count of this pod's index, read inside a trainer pod (0 on the first start)."""
    total = 0
    for name in (ENV_INDEX_FAILURES, ENV_INDEX_IGNORED_FAILURES):
        value = (env.get(name) or "").strip()
        total += int(value) if value.isdigit() else 0
    return total


def run_dir_for(spec: RunSpec) -> str:
    """Where the run directory is inside the pods: stable across pod restarts (never a timestamp)."""
    return spec.run_dir or f"{RUNS_ROOT}/{spec.name}"


def check_name(kind: str, value: str, pattern: re.Pattern[str] = _DNS1123_SUBDOMAIN) -> None:
    if not value or len(value) > 253 or not pattern.fullmatch(value):
        raise ValidationError(
            f"{kind} {value!r} is not a valid Kubernetes name: use lowercase letters, digits and '-'"
        )


def validate_spec(spec: RunSpec, namespace: str, claim: str = DEFAULT_CLAIM) -> None:
    """Check a RunSpec for Kubernetes before anything is built or sent.

    Raises `ValidationError` with a one-line message naming the fix. (The spec checked itself
    when it was built.)
    """
    if spec.image is None or not spec.image.strip():
        raise ValidationError(
            "a Kubernetes run needs an image: pass image=... (a container image with tgnb[train])"
        )
    if spec.image != spec.image.strip() or any(c.isspace() for c in spec.image):
        raise ValidationError(
            f"image {spec.image!r} contains whitespace: pass a plain image reference"
        )
    if not _DNS1035.fullmatch(spec.name):
        raise ValidationError(
            f"run name {spec.name!r} is not valid on Kubernetes: start it with a letter "
            "(its Service and pod host names must)"
        )
    check_name("namespace", namespace, _DNS1035)
    if len(namespace) > 63:
        raise ValidationError(f"namespace {namespace!r} is longer than 63 characters: shorten it")
    check_name("volume claim", claim)
    run_dir = run_dir_for(spec)
    if not run_dir.startswith("/") or run_dir.rstrip("/") in ("", CONFIG_DIR) or ":" in run_dir:
        raise ValidationError(
            f"run_dir {run_dir!r} cannot be mounted: pass an absolute path such as {RUNS_ROOT}/NAME"
        )
    for name in spec.env:
        if not _ENV_NAME.fullmatch(name):
            raise ValidationError(
                f"environment variable name {name!r} is not valid: use [A-Za-z_0-9]"
            )
        if name in RESERVED_ENV:
            raise ValidationError(f"environment variable {name} is set by tgnb: drop it from env")
        if name in spec.secrets:
            raise ValidationError(f"{name} is both in env and in secrets: keep it in secrets only")
        # a name or value that looks like a secret is refused by spec.validate(), for every engine
    for name, ref in spec.secrets.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValidationError(
                f"environment variable name {name!r} is not valid: use [A-Za-z_0-9]"
            )
        if name in RESERVED_ENV:
            raise ValidationError(
                f"environment variable {name} is set by tgnb: drop it from secrets"
            )
        check_name(f"secret for {name}", ref.name)
        key = ref.key or name
        if not _SECRET_KEY.fullmatch(key):
            raise ValidationError(f"secret key {key!r} for {name} is not valid: use [-._a-zA-Z0-9]")


#: The scheduling gate on the pods of a run whose placer places them (`needs_placer`).
PLACEMENT_GATE = "tgnb.together.ai/placement"
PLACER_CONFIG_FILE = "placer.json"
PLACER_CONTAINER = "placer"
#: On the placer's pod instead of `RUN_LABEL` (the run's pods are those that carry that one).
PLACER_LABEL = "tgnb/placer-of"


def needs_placer(spec: RunSpec) -> bool:
    """Whether the run's pods wait for its placer (`tgnb.backends.kubernetes.placer`): a policy
    that leaves preemptible nodes after `wait_s` > 0, or by a deadline. ``"standard"`` with no
    wait and no deadline is a preferred node affinity, which the scheduler renders by itself."""
    policy = spec.policy
    if not spec.resources.preemptible:
        return False
    return (policy.when_short == "standard" and policy.wait_s > 0) or policy.deadline is not None


def placer_name(run: str) -> str:
    """The placer's Deployment, ServiceAccount, ConfigMap, Role and RoleBinding."""
    return f"{run}-placer"


def placer_cluster_name(namespace: str, run: str) -> str:
    """The placer's ClusterRole and ClusterRoleBinding: cluster-wide, so the namespace is in the
    name, joined by ``:``, which neither a namespace (a DNS label) nor a run name can hold: two
    (namespace, run) pairs never share one (``ml``/``team-train`` and ``ml-team``/``train`` did
    with ``-``). RBAC names are path segments, where ``:`` is allowed (``system:node``)."""
    return f"tgnb-placer:{namespace}:{run}"
