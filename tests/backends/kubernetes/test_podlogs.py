"""A Kubernetes run's records from its pods' logs after a cursor: a second poll asks the ended
pod nothing and the live pod only for what it logged since (bytes counted, not timed), and the
records are those of reading every log whole. Fakes the API server at the HTTP boundary (none can
run here: tests/backends/kubernetes/conftest.py); its log route answers as the kubelet does,
honouring ``timestamps`` and ``sinceSeconds`` against its own clock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.kubernetes.backend import KubernetesBackend
from tgnb.backends.kubernetes.podlogs import MARGIN, take
from tgnb.events import STDOUT_PREFIX, parse_record
from tgnb.runs import cursor
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore

NS = "research"
PODS = f"/api/v1/namespaces/{NS}/pods"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"


@dataclass
class Kubelet:
    """One container's log: (time, line) pairs, answered as ``GET .../log`` answers."""

    lines: list[tuple[datetime, str]] = field(default_factory=list)

    def add(self, at: datetime, line: str) -> None:
        self.lines.append((at, line))

    def __call__(self, req: Any) -> tuple[int, bytes]:
        since = req.query.get("sinceSeconds")
        start = datetime.now(timezone.utc) - timedelta(seconds=int(since[0])) if since else None
        stamps = req.query.get("timestamps") == ["true"]
        out = []
        for at, line in self.lines:
            if start is None or at >= start:
                ts = at.strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".") + "Z"
                out.append(f"{ts} {line}" if stamps else line)
        return 200, "".join(f"{ln}\n" for ln in out).encode()


def _metrics(step: int) -> str:
    return STDOUT_PREFIX + json.dumps({"kind": "metrics", "step": step, "loss": 1 / step})


def test_a_second_poll_asks_only_for_the_new_lines(
    fake_api: Any, api_client: Any, k8s: Any, tmp_path: Path
) -> None:
    now = datetime.now(timezone.utc)
    old, live = Kubelet(), Kubelet()
    for step in range(1, 1001):  # the preempted attempt, an hour ago
        old.add(now - timedelta(hours=1, seconds=-step / 10), _metrics(step))
    for step in range(801, 2001):  # the live one, resumed at 800: a step a second until 5 min ago
        live.add(now - timedelta(seconds=2300 - step), _metrics(step))
    fake_api.route("GET", f"{JOBS}/long", (200, k8s.job("long")))
    ended = k8s.pod("long-0-a", run="long", phase="Failed", exit_code=75)
    running = k8s.pod("long-0-b", run="long", created="2026-11-29T19:05:00Z", ignored=1)
    fake_api.route("GET", PODS, (200, k8s.pods(running, ended)))
    fake_api.route("GET", f"{PODS}/long-0-a/log", old)
    fake_api.route("GET", f"{PODS}/long-0-b/log", live)
    backend = KubernetesBackend(api_client, NS, poll_interval=0.01)
    store = RunStore(tmp_path / "home")
    rec = store.create(RunSpec(name="long", train={}, resources=Resources()), backend="kubernetes")
    store.add_job(rec.id, "long")
    run = Run(store.get(rec.id), store, backend)

    steps = [r["step"] for r in run.records("metrics")]
    assert steps == list(range(1, 1001)) + list(range(801, 2001))
    first = cursor.engine_log(backend, "long").read
    assert first > 100_000  # both logs, whole

    new = [(now + timedelta(seconds=k / 10), _metrics(2000 + k)) for k in (1, 2)]
    for at, line in new:
        live.add(at, line)
    asked = len(fake_api.requests)
    assert [r["step"] for r in run.records("metrics")][-3:] == [2000, 2001, 2002]
    logs = [r for r in fake_api.requests[asked:] if r.path.endswith("/log")]
    assert [r.path.split("/")[-2] for r in logs] == ["long-0-b"]  # the ended pod: not again
    assert int(logs[0].query["sinceSeconds"][0]) < 400  # from its last line, not its start
    second = cursor.engine_log(backend, "long").read - first
    sent = live(logs[0])[1]
    assert second == len(sent)  # what the API sent: the lines since `MARGIN` s before the last
    assert len(sent.splitlines()) <= MARGIN + 2 + 2 and second < first / 100

    # the next poll asks again from the margin before the last line: nothing is taken twice
    live.add(now + timedelta(seconds=1), _metrics(2003))
    assert [r["step"] for r in run.records("metrics")][-4:] == [2000, 2001, 2002, 2003]
    whole = old.lines + live.lines
    records = [parse_record(line) for _, line in whole]
    assert [r["step"] for r in run.records("metrics")] == [r["step"] for r in records if r]


def test_lines_of_one_timestamp_are_told_apart_by_their_count() -> None:
    """Two lines may carry the same timestamp: the cursor counts those it read."""
    ts = "2026-12-07T00:00:01.5Z"
    lines, mark = take(f"{ts} a\n{ts} b\n".encode(), None)
    assert lines == ["a", "b"] and mark.same == 2
    again, mark = take(f"2026-12-07T00:00:01.4Z x\n{ts} a\n{ts} b\n{ts} c\n".encode(), mark)
    assert again == ["c"] and mark.same == 3
    later, _ = take(f"{ts} a\n{ts} b\n{ts} c\n2026-12-07T00:00:02Z d\n".encode(), mark)
    assert later == ["d"]
