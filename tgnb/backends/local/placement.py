"""One placement of a local run: the facts it decides by (`tgnb.runs.recovery.Facts`: the
emulator's node list and the run's own progress) and the supervisor's ends of the one placement
loop (`tgnb.runs.placing.PlacementLoop`): `Placement`, the engine of one start, and `Running`,
the engine of one attempt on standard nodes (the move back to preemptible ones)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tgnb.backends.base import JobState
from tgnb.backends.local.nodes import NodeInfo
from tgnb.runs.recovery import Decision, Facts, progress
from tgnb.runs.spec import RunSpec

if TYPE_CHECKING:
    from tgnb.backends.local.supervisor import Supervisor


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


class Placement:
    """The supervisor's placement of one start (`restart`): observes the emulator's nodes, claims
    the nodes decided in the run store (`chosen` once it did) and records each decision."""

    def __init__(self, sup: Supervisor, restart: int) -> None:
        self.sup = sup
        self.restart = restart
        self.short_since: float | None = None  # since when the run waits (monotonic)
        self.now = 0.0
        self.nodes: list[NodeInfo] = []
        self.chosen: list[NodeInfo] | None = None
        self.unreachable = False

    def observe(self) -> Facts | None:
        """The facts of the cluster now; None while the emulator cannot be reached (said once,
        and the decision after it is recorded again)."""
        nodes = self.sup.refresh()
        if nodes is None:
            if not self.unreachable:
                self.sup.store.set_state(
                    self.sup.record.id, JobState.PENDING, "emulator unreachable; retrying"
                )
                self.unreachable = True
            return None
        self.unreachable, self.nodes, self.now = False, nodes, time.monotonic()
        return self.sup.facts(nodes, self.now - (self.short_since or self.now))

    def act(self, d: Decision) -> Decision:
        """Claim the nodes of a start; a start whose GPUs another run of the cluster holds
        becomes a wait that says so."""
        if d.action == "start":
            ready = sorted(
                (n for n in self.nodes if n.kind == d.node_class and n.schedulable),
                key=lambda n: n.name,
            )
            gpus = self.sup.record.spec.resources.gpus_per_node
            chosen = self.sup.store.claim(
                self.sup.record.id, [(n.name, n.gpus) for n in ready], want=d.nodes,
                least=d.nodes, gpus_per_node=gpus, restart_count=self.restart,
            )  # fmt: skip
            if chosen:
                self.sup.node_class = d.node_class
                by_name = {n.name: n for n in ready}
                self.chosen = [by_name[c] for c in chosen]
                return d
            held = (
                f"waiting for {d.nodes} schedulable {d.node_class} node(s) with "
                f"{gpus} free GPUs (held by other runs)"
            )
            d = dataclasses.replace(d, action="wait", reason=held)
        self.short_since = self.short_since or self.now
        return d

    def record(self, d: Decision) -> None:
        self.sup.decision(d)
        if d.action == "wait":
            self.sup.store.set_state(self.sup.record.id, JobState.PENDING, d.reason)

    def done(self) -> bool:
        return self.chosen is not None or self.sup.stop_requested


class Running:
    """The supervisor's end of the loop while an attempt runs on standard nodes: the facts of the
    emulator's nodes as last read, and a move back to preemptible nodes (`decide`'s) carried out
    by stopping the attempt (`Supervisor.moving`: it checkpoints, and restarts there), once per
    attempt."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def observe(self) -> Facts | None:
        if self.sup.node_class != "standard" or self.sup.moving:
            return None
        facts = self.sup.facts(list(self.sup._cache.values()), 0.0)
        return dataclasses.replace(facts, current="standard")

    def act(self, d: Decision) -> Decision:
        if d.action == "start":
            self.sup.moving = True  # the supervisor stops the attempt
        return d

    def record(self, d: Decision) -> None:
        self.sup.decision(d)

    def done(self) -> bool:
        return self.sup.moving
