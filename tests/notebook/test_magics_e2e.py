"""The quickstart through ``%tg`` in a real IPython shell against a real emulator: attach, scale,
launch a tiny GRPO run on a preemptible node (real TRL on the CPU), preempt its node, watch it
checkpoint and resume, then runs, logs, events, the timeline and the cost report."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle, running_emulator
from tgnb.events import CHECKPOINT_SAVED, PREEMPTION_NOTIFIED, RUN_RESUMED
from tgnb.notebook.timeline import EventTimeline
from tgnb.notebook.widgets import RunPanel


@pytest.fixture
def slow_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EmulatorHandle]:
    """Platform time 33x faster (a 9 s drain window): room for a CPU-trained step to checkpoint
    on a shared 2-core machine."""
    with running_emulator(tmp_path, time_scale=0.03) as emu:
        for key, value in emu.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        yield emu


@pytest.mark.slow
def test_quickstart_through_magics(
    ip: Any,
    tg: Any,
    slow_emulator: EmulatorHandle,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tg.poll_interval = 0.2
    ip.run_line_magic("tg", "attach --local")
    try:
        assert ip.run_line_magic("tg", "scale --preemptible 8 --wait --timeout 60s").reached
        ip.run_cell_magic(
            "tg",
            "launch --name qs-grpo --steps 400 -o run1",
            "algorithm: grpo\nmodel: tiny\ncheckpoint: {every_steps: 3}\n",
        )
        run = ip.user_ns["run1"]
        assert run.name == "qs-grpo"
        wait_until(
            lambda: any(e.reason == CHECKPOINT_SAVED for e in run.run_events()),
            300,
            what="a first checkpoint",
            every=0.5,
        )
        panel = ip.run_line_magic("tg", "watch qs-grpo")
        assert isinstance(panel, RunPanel)

        node = wait_until(lambda: run.status.nodes, 30, what="the run's node", every=0.5)[0]
        assert node.startswith("gpu-preemptible-dp")
        ip.run_line_magic("tg", f"preempt {node}")
        wait_until(
            lambda: any(e.reason == RUN_RESUMED for e in run.run_events()),
            300,
            what="the resume",
            every=0.5,
        )

        assert "qs-grpo" in str(ip.run_line_magic("tg", "runs"))
        ip.run_line_magic("tg", "logs qs-grpo")
        assert capsys.readouterr().out.strip()
        ip.run_line_magic("tg", f"events --since 1h --node {node}")
        assert PREEMPTION_NOTIFIED in capsys.readouterr().out
        tl = ip.run_line_magic("tg", "events --since 1h --timeline")
        assert isinstance(tl, EventTimeline) and tl.preemptions >= 1
        assert 'class="span drain"' in tl.to_svg()

        panel.refresh()
        assert {"checkpoint", "preemption", "resume"} <= {k for _, k in panel.markers()}
        panel.close()

        ip.run_line_magic("tg", "stop qs-grpo")
        wait_until(lambda: run.state.finished, 120, what="the stop", every=0.5)
        capsys.readouterr()
        ip.run_line_magic("tg", "logs qs-grpo -f")  # a finished run: prints its log and returns
        out = capsys.readouterr().out
        assert "checkpointed" in out  # the program's own output (tgnb's stop line)
        assert "@tgnb" not in out  # protocol records are parsed, not printed
        report = ip.run_line_magic("tg", "cost")
        (row,) = report.runs
        assert row.preemptible_gpu_hours > 0 and row.standard_gpu_hours == 0
        assert row.preemptions >= 1
    finally:
        tg.poll_interval = 2.0
        for r in tg.session.runs():
            if not r.state.finished:
                r.stop()
