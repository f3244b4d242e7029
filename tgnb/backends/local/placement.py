"""The facts a local placement decides by (`tgnb.runs.recovery.Facts`): the emulator's node list
and the run's own progress."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from tgnb.backends.local.nodes import NodeInfo
from tgnb.runs.recovery import Facts, progress
from tgnb.runs.spec import RunSpec


def placement_facts(
    spec: RunSpec, nodes: Sequence[NodeInfo], short_for: float, run_dir: Path, started: float
) -> Facts:
    """What `tgnb.runs.recovery.decide` needs: the schedulable nodes of each class with the GPUs
    the run needs, the preemptible GPUs that stay (running, no notice), and the run's progress from
    its metrics.jsonl (the step time is observed since the run first started, waits included: a
    conservative estimate for a deadline)."""
    res = spec.resources
    free = {
        kind: sum(
            1 for n in nodes if n.kind == kind and n.schedulable and n.gpus >= res.gpus_per_node
        )
        for kind in ("preemptible", "standard")
    }
    live = sum(n.gpus for n in nodes if n.preemptible and n.schedulable)
    return Facts(
        nodes=res.nodes,
        min_nodes=res.min_nodes,
        preemptible=res.preemptible,
        free=free,
        short_for_s=short_for,
        allocated_gpus=live,
        desired_gpus=res.nodes * res.gpus_per_node,
        gpus_per_node=res.gpus_per_node,
        **progress(run_dir, started, spec.train.planned_steps, time.time()),
    )
