"""A sweep as one object with real runs (issue 47 §2): ``session.map`` of a small function on
the local engine (a real emulator over HTTP, the real supervisor, real processes) is one sweep;
a new session on the same tgnb home, as a restarted kernel attaches, opens it again from the run
store; ``%tg sweeps`` and ``%tg sweep NAME`` show it; ``%tg sweep NAME --stop`` stops every run
of another sweep."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.runs.spec import JobState
from tgnb.runs.sweeps import Sweep
from tgnb.session import Session, attach


def cube(x: int) -> int:
    return x**3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_map_is_one_sweep_kept_across_a_kernel_restart_with_one_stop(
    session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ip: Any, capsys: Any
) -> None:
    wd = tmp_path / "notebook"
    wd.mkdir()
    monkeypatch.chdir(wd)  # the notebook's folder: the default workdir
    sweep = session.executor(name="cubes", gpus_per_node=1).map(cube, [1, 2, 3])
    assert isinstance(sweep, Sweep) and sweep.name == "cubes"
    assert [r.name for r in sweep] == ["cubes-0", "cubes-1", "cubes-2"]
    rows = sweep.wait(timeout=400, poll=0.5)
    assert [(r.state, r.metric, r.best) for r in rows] == [
        ("succeeded", "result", 1.0),
        ("succeeded", "result", 8.0),
        ("succeeded", "result", 27.0),
    ]
    assert sweep.results() == [1, 8, 27]
    best = sweep.best()
    assert best is not None and best.run == "cubes-2"

    again = attach(session.cluster.id, local=True, home=tmp_path)  # a restarted kernel
    assert [s.name for s in again.sweeps()] == ["cubes"]
    opened = again.sweep("cubes")
    assert [r.id for r in opened] == [r.id for r in sweep] and opened.record.source == "map"
    assert opened.headline() == "sweep cubes: 3 runs (3 succeeded)"

    tg = ip.magics_manager.registry["Tg"]
    tg.session = again
    try:
        listed = str(ip.run_line_magic("tg", "sweeps"))
        assert "cubes" in listed and "3 succeeded" in listed and "cubes-2: result 27" in listed
        view = ip.run_line_magic("tg", "sweep cubes -o cubes")
        html = view._repr_html_()
        assert html.count("<tr data-run=") == 3 and "★ result 27" in html
        assert isinstance(ip.user_ns["cubes"], Sweep)
        # the HTML a notebook shows for the handle itself, once %load_ext tgnb ran: table and
        # chart (this terminal shell has HTML output off: its printer is read and called)
        printer = ip.display_formatter.formatters["text/html"].lookup(ip.user_ns["cubes"])
        shown = printer(ip.user_ns["cubes"])
        assert "tgnb-sweep-chart" in shown and "cubes-1" in shown

        sleepers = session.executor(name="sleepers", gpus_per_node=1).map(time.sleep, [600, 600])
        wait_until(lambda: all(r.status.nodes for r in sleepers), timeout=120)
        capsys.readouterr()
        ip.run_line_magic("tg", "sweep sleepers --stop")
        said = capsys.readouterr().out
        assert "stop requested for 2 run(s) of sweep sleepers: sleepers-0, sleepers-1" in said
        rows = again.sweep("sleepers").wait(timeout=120, poll=0.5)
        assert [r.state for r in rows] == [JobState.CANCELLED.value] * 2
        ip.run_line_magic("tg", "sweep sleepers --stop")
        assert "already finished: nothing to stop" in capsys.readouterr().out
    finally:
        tg.session = None
