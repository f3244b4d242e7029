"""What tgnb reads back and names under the third red-team pass (issue 34, items 13, 14, 17 and
"also noticed"):

- the ``server.json`` a crashed emulator daemon left, hostile: ``tgnb emulator status`` and
  ``stop`` answer in one line (`RECORDS`: ``pid: "abc"`` crashed them), and a bare ``start``
  comes up with the recorded options that are in range (`CRASHED_WITH`: one out of range was
  restored unchecked and every start failed after 30 s), real daemons on loopback;
- the Kubernetes placer's cluster-wide names for namespace/run pairs that collided
  (``ml``/``team-train`` and ``ml-team``/``train``), each object still valid against the 1.30
  schema;
- ``Checkpointer.log(step=...)``: refused at the call (it failed at the step's end), real torch;
- NaN and infinities in an event's data or a run's metrics reach the server extension's JSON as
  ``null`` (Python wrote ``NaN``, which a browser's ``JSON.parse`` refuses, dropping the message).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator import daemon
from tgnb.emulator.home import emulator_home
from tgnb.emulator.options import OPTION_RANGES
from tgnb.errors import TrainConfigError

from .conftest import record


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: (id, a server.json no daemon holds) that ``tgnb emulator status`` and ``stop`` read
RECORDS: list[tuple[str, Any]] = [
    ("pid-string", {"pid": "abc", "port": 8000, "options": {}}),
    ("pid-null", {"pid": None, "port": 8000}),
    ("pid-list", {"pid": [1], "port": 8000}),
    ("pid-2^70", {"pid": 2**70, "port": 8000}),
    ("pid-1e400", {"pid": "1" + "0" * 400, "port": 8000}),
]

#: (id, options a crashed daemon recorded) that a bare ``start`` must not restore as they are
CRASHED_WITH: list[tuple[str, Any]] = [
    ("time-scale-1e-9", {"time_scale": 1e-9}),
    ("time-scale-string", {"time_scale": "fast"}),
    ("chaos-5", {"chaos": 5}),
    ("capacity-negative", {"capacity_gpus": -8}),
    ("trace-missing", {"capacity_trace": "/nonexistent/trace.json"}),
]


def _plant(tmp_path: Path, content: Any) -> Path:
    eh = emulator_home(tmp_path)
    eh.mkdir(parents=True)
    (eh / "server.json").write_text(json.dumps(content))
    return eh


@pytest.mark.parametrize("command", ["status", "stop"])
@pytest.mark.parametrize("content", [r[1] for r in RECORDS], ids=[r[0] for r in RECORDS])
def test_a_record_no_daemon_holds_is_not_trusted(
    tmp_path: Path, content: Any, command: str
) -> None:
    _plant(tmp_path, content)
    cli = subprocess.run(
        [sys.executable, "-m", "tgnb.emulator.cli", command, "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = cli.stdout.strip() + cli.stderr.strip()
    ok = said == ("emulator was not running" if command == "stop" else f"emulator: not running "
                  f"(home {emulator_home(tmp_path)})")  # fmt: skip
    record(ok, server_error="Traceback" in said)
    assert ok, (cli.returncode, said[-500:])


@pytest.mark.parametrize("had", [c[1] for c in CRASHED_WITH], ids=[c[0] for c in CRASHED_WITH])
def test_a_bare_start_after_a_crash_restores_only_options_in_range(
    tmp_path: Path, had: dict[str, Any]
) -> None:
    """A bare start (nothing asked) comes back with what the crashed daemon recorded, less what
    is out of range (the daemon refuses it: a start waited 30 s, then failed)."""
    _plant(tmp_path, {"pid": _dead_pid(), "port": _free_port(), "options": had})
    try:
        st, started = daemon.start(tmp_path, asked=[])
        flat = st.options or {}
        in_range = all(
            lo <= flat[name] <= hi
            for name, (lo, hi) in OPTION_RANGES.items()
            if isinstance(flat.get(name), int | float)
        )
        ok = started and st.running and in_range and flat.get("capacity_trace") is None
    finally:
        daemon.stop(tmp_path)
    record(ok)
    assert ok, st


#: Namespace/run pairs whose cluster-wide names were one ("tgnb-placer-ml-team-train").
PAIRS = [("ml", "team-train"), ("ml-team", "train"), ("a-b-c", "d"), ("a", "b-c-d")]


def test_placer_cluster_names_never_collide_across_namespaces() -> None:
    import kubernetes_validate

    from tgnb.backends.base import Resources, RunSpec
    from tgnb.backends.kubernetes.objects import build_objects
    from tgnb.runs.recovery import RecoveryPolicy

    names: dict[str, tuple[str, str]] = {}
    for namespace, run in PAIRS:
        spec = RunSpec(
            name=run,
            train={"algorithm": "grpo", "model": "tiny", "max_steps": 10},
            resources=Resources(nodes=1),
            image="ghcr.io/example/tgnb:1",
            recovery=RecoveryPolicy(when_short="standard", wait_s=600),
        )
        docs = build_objects(spec, namespace, launched=1.8e9).to_dicts()
        for doc in docs:
            kubernetes_validate.validate(doc, "1.30", strict=True)
        cluster = {d["metadata"]["name"] for d in docs if d["kind"].startswith("ClusterRole")}
        (name,) = cluster  # the ClusterRole and its binding share one name
        assert "/" not in name and "%" not in name and name not in (".", "..")  # a path segment
        clash = names.get(name)
        record(clash is None)
        assert clash is None, f"{(namespace, run)} and {clash} share {name}"
        names[name] = (namespace, run)


@pytest.mark.parametrize("column", ["step", "time"])
def test_checkpointer_log_of_a_row_column_is_refused_at_once(tmp_path: Path, column: str) -> None:
    import torch

    from tgnb.train import Checkpointer

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = Checkpointer(model, opt, max_steps=2, dir=tmp_path, exit=False)
    refusals = []
    for step in c.steps():
        with pytest.raises(TrainConfigError, match="log it under another name") as info:
            c.log(**{column: step})
        refusals.append(str(info.value))
        c.log(loss=1.0 / step)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ok = c.exit_code == 0 and [r["step"] for r in rows] == [1, 2] and len(refusals) == 2
    record(ok and all("\n" not in r for r in refusals))
    assert ok, (c.exit_code, rows)


NOT_FINITE = [float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("value", NOT_FINITE, ids=["nan", "inf", "-inf"])
def test_the_servers_json_holds_no_nan(value: float) -> None:
    from tgnb.events import Event, utcnow
    from tgnb.server.serialize import event_json

    ev = Event(utcnow(), "run", "RunFailed", "x", run="r", data={"loss": value, "l": [value]})

    def strict(text: str) -> Any:  # as a browser's JSON.parse: no NaN, no Infinity
        def refuse(word: str) -> Any:
            raise ValueError(word)

        return json.loads(text, parse_constant=refuse)

    try:
        got = strict(json.dumps(event_json(ev)))
    except ValueError:
        got = None
    ok = got is not None and got["data"] == {"loss": None, "l": [None]}
    record(ok)
    assert ok, got
