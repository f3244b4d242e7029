"""tgnb.cloud: the control plane, a facade over the official ``together`` SDK's ``clusters``.

``Cloud`` attaches to a cluster by id or name and creates or deletes clusters; a ``Cluster`` reads
its status (``ClusterState``: standard and preemptible nodes, target against allocated), scales the
preemptible target (checked before any request), waits for capacity and feeds its node lifecycle
events incrementally; `Cluster.preemption_rate` estimates how often its preemptible nodes are
preempted from those events (`tgnb.cloud.rates`). Errors are ``tgnb.errors``; the API key never appears in them.
"""

from __future__ import annotations

from tgnb.cloud.client import RetryPolicy, make_client, translate
from tgnb.cloud.cloud import Cloud
from tgnb.cloud.cluster import Cluster, WaitResult
from tgnb.cloud.feed import EventFeed
from tgnb.cloud.models import PREEMPTIBLE_PREFIX, ClusterState, NodeState
from tgnb.cloud.rates import PreemptionRate
from tgnb.cloud.validate import GPUS_PER_NODE, check_target

__all__ = [
    "GPUS_PER_NODE",
    "PREEMPTIBLE_PREFIX",
    "Cloud",
    "Cluster",
    "ClusterState",
    "EventFeed",
    "NodeState",
    "PreemptionRate",
    "RetryPolicy",
    "WaitResult",
    "check_target",
    "make_client",
    "translate",
]
