"""The node view the emulator's admin route serves is the one the local backend reads: the fleet
renders `NodeInfo.to_wire` and `NodeInfo.from_wire` reads it back, key for key (no probing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.emulator.nodeview import NodeInfo

from .test_fleet import body, make, run_until


def test_the_fleets_nodes_read_back_as_the_typed_view(tmp_path: Path) -> None:
    fleet, clock = make(tmp_path, provision_delay_s=60, drain_window_s=300)
    cid = fleet.create(body(num_preemptible_gpus=8))["cluster_id"]
    run_until(fleet, clock, clock.t + 61)
    victim = next(n["name"] for n in fleet.nodes(cid) if n["kind"] == "preemptible")
    fleet.preempt(cid, victim)
    wire = fleet.nodes(cid)
    nodes = {n.name: n for n in map(NodeInfo.from_wire, wire)}
    assert [n.to_wire() for n in map(NodeInfo.from_wire, wire)] == wire  # a round trip
    node = nodes[victim]
    assert node.cluster_id == cid and node.preemptible and node.state == "draining"
    assert node.deadline == pytest.approx(clock.t + 300) and node.notified()
    assert node.notice_file is not None and node.notice_file.exists()  # the file contract
    assert not node.schedulable and not node.removed()
    assert all(n.gpus == 8 and n.directory for n in nodes.values())


def test_a_view_lacking_a_key_is_refused_by_name(tmp_path: Path) -> None:
    fleet, _ = make(tmp_path, provision_delay_s=0)
    cid = fleet.create(body())["cluster_id"]
    wire = dict(fleet.nodes(cid)[0])
    del wire["dir"]
    with pytest.raises(ValueError, match="lacks 'dir'"):
        NodeInfo.from_wire(wire)
