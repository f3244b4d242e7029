"""The capacity trace: preemptible capacity withdrawn for a while, then restored, in platform time.

The fleet's rules on a controlled clock; then a real daemon over HTTP (the admin route through
`AdminClient`, the SDK reading ``node_lifecycle_events``) and the real ``tgnb emulator start
--capacity-trace FILE`` command.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until
from tgnb.emulator import daemon
from tgnb.emulator.admin import AdminClient
from tgnb.emulator.testing import EmulatorHandle
from tgnb.emulator.trace import generate, parse
from tgnb.emulator.validation import RequestError
from tgnb.events import PREEMPTED, PREEMPTION_NOTIFIED, parse_time

from .conftest import create
from .test_fleet import body, make, run_until

SEGMENTS = [{"at_s": 0, "gpus": 16}, {"at_s": 600, "gpus": 8}, {"at_s": 1500, "gpus": 16}]


def preemptible(fleet: Any, cid: str) -> dict[str, str]:
    return {n["name"]: n["state"] for n in fleet.nodes(cid) if n["kind"] == "preemptible"}


def test_a_withdrawal_preempts_through_the_drain_window_and_a_restore_provisions(
    tmp_path: Path,
) -> None:
    # platform time at a 0.02 scale: 600 s of trace are 12 s of the clock, the 300 s window 6 s
    fleet, clock = make(tmp_path, time_scale=0.02, provision_delay_s=60, drain_window_s=300)
    cid = fleet.create(body(num_preemptible_gpus=16))["cluster_id"]
    fleet.set_capacity_trace({"segments": SEGMENTS})
    t0 = clock.t
    run_until(fleet, clock, t0 + 11.9, step=0.1)
    assert list(preemptible(fleet, cid).values()) == ["running", "running"]
    run_until(fleet, clock, t0 + 12.05, step=0.1)  # 600 s: 8 GPUs left, the newest node goes
    states = preemptible(fleet, cid)
    assert sorted(states.values()) == ["draining", "running"]
    victim = next(n for n, s in states.items() if s == "draining")
    assert victim.endswith("-1")  # the newest
    view = fleet.retrieve(cid)
    notice = next(e for e in view["node_lifecycle_events"] if e["reason"] == PREEMPTION_NOTIFIED)
    assert parse_time(notice["timestamp"]).timestamp() == pytest.approx(t0 + 12.0, abs=0.11)
    assert "capacity withdrawn: 8 preemptible GPUs available" in notice["message"]
    assert view["allocated_preemptible_gpus"] == 16  # draining is live until removed
    run_until(fleet, clock, t0 + 18.2, step=0.1)  # the window ends: removed, not replaced
    assert sorted(preemptible(fleet, cid).values()) == ["removed", "running"]
    reasons = [e["reason"] for e in fleet.retrieve(cid)["node_lifecycle_events"]]
    assert PREEMPTED in reasons
    run_until(fleet, clock, t0 + 29.9, step=0.1)  # still withdrawn up to 1500 s
    assert fleet.retrieve(cid)["allocated_preemptible_gpus"] == 8
    assert fleet.capacity_trace()["gpus_now"] == 8  # type: ignore[index]
    run_until(fleet, clock, t0 + 30.0 + 1.3, step=0.1)  # restored: provisioned again (60 s)
    assert fleet.retrieve(cid)["allocated_preemptible_gpus"] == 16


def test_the_trace_limits_all_clusters_together_or_one(tmp_path: Path) -> None:
    fleet, clock = make(tmp_path, provision_delay_s=10, drain_window_s=30)
    a = fleet.create(body(cluster_name="a", num_preemptible_gpus=8))["cluster_id"]
    run_until(fleet, clock, clock.t + 12)
    b = fleet.create(body(cluster_name="b", num_preemptible_gpus=8))["cluster_id"]
    run_until(fleet, clock, clock.t + 12)
    fleet.set_capacity_trace({"segments": [{"at_s": 0, "gpus": 8}]})  # both share 8 GPUs
    drained = [c for c in (a, b) if "draining" in preemptible(fleet, c).values()]
    assert drained == [b]  # the newest node of all clusters
    fleet.set_capacity_trace({"segments": [{"at_s": 0, "gpus": 0}], "cluster_id": a})
    assert "draining" in preemptible(fleet, a).values()
    with pytest.raises(RequestError) as info:
        fleet.set_capacity_trace({"segments": [{"at_s": 0, "gpus": 0}], "cluster_id": "nope"})
    assert info.value.status == 404


def test_a_seeded_trace_is_the_same_for_the_same_seed() -> None:
    doc = {
        "seed": 7,
        "capacity_gpus": 16,
        "withdrawn_gpus": 8,
        "mean_between_s": 3600,
        "mean_outage_s": 600,
        "duration_s": 48 * 3600,
    }
    a, b, c = generate(doc), generate(dict(doc)), generate({**doc, "seed": 8})
    assert a == b and a != c
    assert [s.gpus for s in a[:5]] == [16, 8, 16, 8, 16]  # withdrawn, then restored
    assert all(x.at_s < y.at_s for x, y in itertools.pairwise(a))
    assert 50 < len(a) < 120  # 48 h / 4200 s a cycle = 41 cycles of 2 segments
    outages = [y.at_s - x.at_s for x, y in zip(a[1::2], a[2::2], strict=False)]
    assert 200 < sum(outages) / len(outages) < 1500


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], "a capacity trace is an object"),
        ({}, "exactly one of segments"),
        ({"segments": [], "generate": {}}, "exactly one of segments"),
        ({"segments": []}, "non-empty list"),
        ({"segments": [{"at_s": 0}]}, "needs at_s (platform seconds) and gpus"),
        ({"segments": [{"at_s": 5, "gpus": 8}, {"at_s": 5, "gpus": 0}]}, "must be after"),
        ({"segments": [{"at_s": -1, "gpus": 8}]}, "segments[0].at_s must be from 0"),
        ({"segments": [{"at_s": 0, "gpus": 8.5}]}, "segments[0].gpus (or null) must be an integer"),
        ({"segments": [{"at_s": 0, "gpus": 8, "x": 1}]}, "unknown segments[0] fields ['x']"),
        ({"generate": {"seed": 1}}, "generate needs"),
        (
            {
                "generate": {
                    "capacity_gpus": 8,
                    "withdrawn_gpus": 16,
                    "mean_between_s": 60,
                    "mean_outage_s": 60,
                }
            },
            "withdrawn_gpus must be an integer from 1 to 8",
        ),
        (
            {
                "generate": {
                    "capacity_gpus": 8,
                    "withdrawn_gpus": 8,
                    "mean_between_s": 1,
                    "mean_outage_s": 1,
                    "duration_s": 1e6,
                }
            },
            "raise mean_between_s or shorten duration_s",
        ),
    ],
)
def test_a_bad_trace_is_refused_with_the_fix(doc: Any, says: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(doc)
    assert info.value.status == 400 and says in info.value.message


def test_the_admin_route_sets_reads_and_ends_a_trace_over_http(
    sdk: Any, emulator: EmulatorHandle
) -> None:
    """At the fixture's 0.01 scale: 300 s of trace are 3 s, the drain window 3 s, provisioning 0.6 s."""
    cid = create(sdk, cluster_name="trace-c", num_preemptible_gpus=16, project_id="p").cluster_id
    wait_until(lambda: sdk.clusters.retrieve(cid).allocated_preemptible_gpus == 16)
    with AdminClient(emulator.base_url, emulator.api_key) as admin:
        got = admin.set_capacity_trace(
            [{"at_s": 0, "gpus": 16}, {"at_s": 300, "gpus": 8}, {"at_s": 900, "gpus": None}],
            cluster_id=cid,
        )
        assert got["gpus_now"] == 16 and got["next_change_s"] == 300 and got["cluster_id"] == cid
        assert admin.capacity_trace()["segments"][1] == {"at_s": 300.0, "gpus": 8}  # type: ignore[index]

        def reasons() -> list[str]:
            return [e.reason for e in sdk.clusters.retrieve(cid).node_lifecycle_events]

        wait_until(lambda: PREEMPTED in reasons(), timeout=30)
        assert reasons().count(PREEMPTION_NOTIFIED) == 1
        assert sdk.clusters.retrieve(cid).allocated_preemptible_gpus == 8
        wait_until(lambda: sdk.clusters.retrieve(cid).allocated_preemptible_gpus == 16, timeout=30)
        for bad, says in (
            ({"segments": [{"at_s": 0, "gpus": "8"}]}, "gpus (or null) must be an integer"),
            ({"segments": [{"at_s": 0, "gpus": 8}], "cluster_id": "missing"}, "not found"),
        ):
            with pytest.raises(httpx.HTTPStatusError) as info:
                admin._call("POST", "/_emulator/capacity/trace", json=bad)
            assert 400 <= info.value.response.status_code < 500
            assert says in info.value.response.json()["message"]
        admin.clear_capacity_trace()
        assert admin.capacity_trace() is None and admin.health()["capacity_trace"] is False


def tgnb_emulator(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TGNB_HOME": str(home)}
    env.pop(daemon.OWNER_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "emulator", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_serve_option_takes_a_yaml_file_and_a_restart_goes_on_with_it(tmp_path: Path) -> None:
    trace = tmp_path / "trace.yaml"
    trace.write_text(
        "generate: {seed: 3, capacity_gpus: 16, withdrawn_gpus: 8,\n"
        "           mean_between_s: 3600, mean_outage_s: 600}\n",
        encoding="utf-8",
    )
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"segments": [{"at_s": 0, "gpus": -8}]}), encoding="utf-8")
    refused = tgnb_emulator(tmp_path, "start", "--capacity-trace", str(bad))
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0  # one line, naming the file and the fix
    assert "bad.json: segments[0].gpus (or null) must be an integer from 0" in refused.stderr
    assert not daemon.status(tmp_path).running
    try:
        started = tgnb_emulator(
            tmp_path, "start", "--time-scale", "0.01", "--capacity-trace", str(trace)
        )
        assert started.returncode == 0, started.stderr
        st = daemon.status(tmp_path)
        assert st.options and st.options["capacity_trace"] == str(trace.resolve())
        key = st.api_key.get() if st.api_key else None
        with AdminClient(st.base_url or "", key) as admin:
            first = admin.capacity_trace()
            assert first is not None and first["segments"][:2] == [
                {"at_s": s.at_s, "gpus": s.gpus} for s in generate(first["generate"])[:2]
            ]
        assert daemon.stop(tmp_path)
        again = tgnb_emulator(
            tmp_path, "start", "--time-scale", "0.01", "--capacity-trace", str(trace)
        )
        assert again.returncode == 0, again.stderr
        st = daemon.status(tmp_path)
        with AdminClient(st.base_url or "", st.api_key.get() if st.api_key else None) as admin:
            after = admin.capacity_trace()
        assert after is not None and after["started_at"] == first["started_at"]  # goes on
        assert after["now_s"] > first["now_s"]
    finally:
        daemon.stop(tmp_path)
