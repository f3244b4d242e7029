"""Where the local engine places a replica group of a fault-tolerant run (issue 50): the run's
recovery policy (`tgnb.runs.recovery.decide`), group by group, in the one placement loop
(`tgnb.runs.placing.PlacementLoop`) whose ends are `GroupPlacement` (a missing group) and
`GroupMove` (a group on a standard node).

- A missing group is decided as a run of one node (`group_facts`: the free nodes of each class
  that no group of the run holds, short since the group went missing): on a free preemptible
  node at once; after ``wait_s`` without one, on a free standard node when ``when_short=
  "standard"`` (or at once when a ``deadline`` says the run is behind); else it waits. Each
  decision is on the run's timeline once (``RecoveryDecided`` with the group's index).
- A group on a standard node goes back to a preemptible one as soon as the policy would start it
  there (`Facts.current`): it leaves (SIGTERM, cause ``moved``: neither a failure nor a
  preemption) and its replacement, placed as above, heals from a live peer. Only while every
  group is in the last quorum, and one group at a time, so that a peer is always there to heal
  from.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tgnb.backends.local.nodes import NodeInfo
from tgnb.backends.local.quorums import group_of
from tgnb.events import RECOVERY_DECIDED
from tgnb.runs.recovery import Decision, Facts, NodeClass

if TYPE_CHECKING:
    from tgnb.backends.local.groups import Groups

#: A group's leaving stopped on purpose to go back to a preemptible node (`Group.cause`).
MOVED = "moved"


def group_facts(
    groups: Groups, nodes: Sequence[NodeInfo], short_for: float, current: NodeClass | None = None
) -> Facts:
    """The facts of one group's placement: the run's (`Supervisor.facts`: capacity, progress)
    for a single node, with the free nodes of each class that no group of the run holds."""
    held = {g.where.name for g in groups.groups.values()}
    gpus = groups.spec.resources.gpus_per_node
    free = {kind: len(free_nodes(nodes, kind, held, gpus)) for kind in ("preemptible", "standard")}
    facts = groups.sup.facts(nodes, short_for)
    return dataclasses.replace(facts, nodes=1, min_nodes=None, free=free, current=current)


def free_nodes(nodes: Sequence[NodeInfo], kind: str, held: set[str], gpus: int) -> list[NodeInfo]:
    """The schedulable nodes of class `kind` with `gpus` GPUs, not `held`, no notice, by name."""
    return sorted(
        (
            n
            for n in nodes
            if n.kind == kind and n.schedulable and n.name not in held and not n.notified()
            and n.gpus >= gpus
        ),
        key=lambda n: n.name,
    )  # fmt: skip


def record(groups: Groups, index: int, d: Decision) -> None:
    groups.sup.event(RECOVERY_DECIDED, f"group {index}: {d.reason}", group=index, **d.data())


class GroupPlacement:
    """The placement of missing group `index`, from when it went missing until it is placed."""

    def __init__(self, groups: Groups, index: int) -> None:
        self.groups = groups
        self.index = index
        self.since = time.monotonic()  # missing since
        #: the node claimed and its class, once a start was decided
        self.chosen: tuple[NodeInfo, NodeClass] | None = None

    def observe(self) -> Facts | None:
        nodes = list(self.groups.sup._cache.values())
        return group_facts(self.groups, nodes, time.monotonic() - self.since)

    def act(self, d: Decision) -> Decision:
        """Claim a free node of the class decided (the run's other groups' nodes kept) and start
        the group there; a start whose node another run took becomes a wait that says so."""
        if d.action != "start":
            return d
        g, sup = self.groups, self.groups.sup
        held = [x.where for x in g.groups.values()]
        names = {n.name for n in held}
        gpus = g.spec.resources.gpus_per_node
        free = free_nodes(list(sup._cache.values()), d.node_class, names, gpus)
        chosen = sup.store.claim(
            sup.record.id, [(n.name, n.gpus) for n in (*held, *free)], want=len(held) + 1,
            least=len(held) + 1, gpus_per_node=gpus, restart_count=g.restart,
        )  # fmt: skip
        new = [c for c in chosen if c not in names]
        if not new:
            why = f"waiting for a schedulable {d.node_class} node with {gpus} free GPUs"
            return dataclasses.replace(d, action="wait", reason=f"{why} (held by other runs)")
        # started by `Groups.replace` once the decision is on the timeline, before the group
        self.chosen = (next(n for n in free if n.name == new[0]), d.node_class)
        return d

    def record(self, d: Decision) -> None:
        record(self.groups, self.index, d)

    def done(self) -> bool:
        return self.chosen is not None


class GroupMove:
    """Group `index` on a standard node: back to a preemptible one as soon as the policy would
    start it there (it leaves, cause `MOVED`; a replacement is placed and heals)."""

    def __init__(self, groups: Groups, index: int) -> None:
        self.groups = groups
        self.index = index
        self.moved = False

    def observe(self) -> Facts | None:
        g = self.groups
        mine = g.groups.get(self.index)
        if mine is None or mine.cause or mine.node_class != "standard" or not self.cheap():
            return None
        nodes = list(g.sup._cache.values())
        return group_facts(g, nodes, 0.0, current="standard")

    def cheap(self) -> bool:
        """Every group is up, none leaving, and all were in the last quorum: a peer stays live
        with the run's weights for the replacement to heal from."""
        g = self.groups
        if len(g.groups) != g.count or any(x.cause for x in g.groups.values()):
            return False
        last = g.reader.last
        inside = {group_of(r) for r in last.members} if last is not None else set()
        return inside >= set(g.groups)

    def act(self, d: Decision) -> Decision:
        """A move decided: `Groups.replace` stops the group once it is on the timeline."""
        self.moved = d.action == "start"
        return d

    def record(self, d: Decision) -> None:
        record(self.groups, self.index, d)

    def done(self) -> bool:
        return self.moved
