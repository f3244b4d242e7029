"""What a notebook cell shows for what the tour returns, in text (a terminal IPython, the
``text/plain`` of a saved notebook): a sentence, not a raw repr. ``run.wait()``'s `JobStatus`
showed ``JobStatus(state=<JobState.SUCCEEDED: 'succeeded'>, ...)``, ``%tg preempt``'s `Preemption`
``<Preemption ...>`` and a panel's `snapshot()` ``<IPython.core.display.HTML object>``."""

from __future__ import annotations

from pathlib import Path

from IPython.core.formatters import DisplayFormatter
from IPython.lib.pretty import pretty

from tgnb.runs import Run
from tgnb.runs.spec import JobState, JobStatus
from tgnb.session import Preemption

from .test_widgets import recorded_run

__all__ = ["recorded_run"]


def _shown(obj: object) -> dict[str, str]:
    data, _ = DisplayFormatter().format(obj)
    return data


def test_a_status_reads_as_a_sentence() -> None:
    status = JobStatus(JobState.SUCCEEDED, 1, ("gpu-preemptible-dp-2",), 0)
    text = pretty(status)
    assert text == "run succeeded after 1 restart, on gpu-preemptible-dp-2, exit 0", text
    assert pretty(JobStatus(JobState.RUNNING)) == "run running"
    assert "JobState" not in _shown(status)["text/plain"]


def test_a_preemption_reads_as_a_sentence_in_text_and_html() -> None:
    p = Preemption.from_view(
        {
            "name": "gpu-preemptible-dp-1",
            "cluster_id": "c-1",
            "gpus": 8,
            "notified_at": "2026-12-06T18:30:01Z",
            "deadline": "2026-12-06T18:35:01Z",
        }
    )
    shown = _shown(p)
    want = (
        "node gpu-preemptible-dp-1 (8 GPUs) preempted: notice at 18:30:01 UTC, removed at "
        "18:35:01 UTC (a 300 s drain window)"
    )
    assert shown["text/plain"] == want
    assert want in shown["text/html"] and "&lt;Preemption" not in shown["text/html"]


def test_a_panel_snapshot_reads_as_its_words(recorded_run: Run, tmp_path: Path) -> None:
    from tgnb.notebook.widgets import RunPanel

    snap = RunPanel(recorded_run, start=False).snapshot()
    shown = _shown(snap)
    assert "tgnb-curve" in shown["text/html"]  # the HTML, for notebooks and exports
    text = shown["text/plain"]
    assert "IPython" not in text and recorded_run.name in text, text
    assert "<" not in text and "\n" not in text, text
