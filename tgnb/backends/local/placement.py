"""The facts a local placement decides by (`tgnb.runs.recovery.Facts`): the emulator's node list
and the run's own progress."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from tgnb.backends.local.nodes import NodeInfo
from tgnb.runs import node
from tgnb.runs.recovery import Facts
from tgnb.runs.spec import RunSpec


def _last_step(metrics: Path) -> int:
    """The newest step in the run's metrics.jsonl (0 when none)."""
    try:
        with open(metrics, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            return int(json.loads(line).get("step") or 0)
    return 0


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
    now = time.time()
    steps = _last_step(run_dir / node.METRICS)
    total = spec.train.get("max_steps")
    return Facts(
        nodes=res.nodes,
        min_nodes=res.min_nodes,
        preemptible=res.preemptible,
        free=free,
        short_for_s=short_for,
        allocated_gpus=live,
        desired_gpus=res.nodes * res.gpus_per_node,
        gpus_per_node=res.gpus_per_node,
        now=now,
        started=started,
        steps_done=steps,
        steps_total=int(total) if isinstance(total, int) and total > 0 else None,
        step_s=(now - started) / steps if steps else None,
    )
