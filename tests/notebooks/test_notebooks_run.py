"""The example notebooks executed with papermill against the real local emulator (see conftest).

Each test reads what the executed notebook shows and checks it against the run store and the
emulator, which are still running under the temporary tgnb home until the module ends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow


def _outputs(nb: Any, cell_id: str | None = None) -> list[dict[str, Any]]:
    """Every output of the notebook's code cells (of one cell, by id)."""
    return [
        o
        for c in nb.cells
        if c.cell_type == "code" and (cell_id is None or c.id == cell_id)
        for o in c.get("outputs", [])
    ]


def _text(output: dict[str, Any]) -> str:
    """Stream text, or an output's text/plain and text/html renderings."""
    if output.get("output_type") == "stream":
        return str(output.get("text", ""))
    data = output.get("data", {})
    return "\n".join(str(data.get(k, "")) for k in ("text/plain", "text/html"))


def _session(home: Path) -> Any:
    from tgnb.session import attach

    return attach(local=True, home=home)  # the daemon the notebooks started, still running


def _run_name(nb: Any, cell_id: str) -> str:
    text = "\n".join(_text(o) for o in _outputs(nb, cell_id))
    # a run displays as a sentence (_repr_pretty_); printed, as its repr
    m = re.search(r"^run (\S+): ", text, re.M) or re.search(r"<Run (\S+) ", text)
    assert m, f"cell {cell_id!r} shows no Run: {text[:300]}"
    return m.group(1)


def _mime(nb: Any, cell_id: str, mime: str) -> str:
    found = [o["data"][mime] for o in _outputs(nb, cell_id) if mime in o.get("data", {})]
    assert found, f"cell {cell_id!r} has no {mime} output"
    return str(found[-1])


def test_quickstart_preempts_checkpoints_and_resumes(executed: Any) -> None:
    from tgnb.demo import checkpoint_in_window

    nb = executed.nb("quickstart")
    max_steps = executed.parameters["quickstart"]["max_steps"]
    run = _session(executed.home).run(_run_name(nb, "launch"))
    summary = run.summary()
    assert summary["state"] == "succeeded", summary
    assert summary["steps"] == max_steps
    assert summary["restarts"] >= 1
    assert checkpoint_in_window(run.events())
    # what the notebook shows agrees with the run store
    check = "".join(_text(o) for o in _outputs(nb, "check"))
    assert f"OK: {max_steps}/{max_steps} steps, {summary['restarts']} restart(s)" in check
    assert "Secret('***')" in _text(_outputs(nb, "setup")[0])  # the kernel saw the key, masked


def test_quickstart_shows_the_timeline_and_panels_statically(executed: Any) -> None:
    nb = executed.nb("quickstart")
    run_name = _run_name(nb, "launch")
    svg = _mime(nb, "timeline", "image/svg+xml")
    assert svg.lstrip().startswith("<svg") and "tgnb-timeline" in svg
    assert svg.count('class="lane lane-preemptible"') >= 2  # the preempted node and its successor
    for part in ('class="span drain"', "TogetherPreemptionNotified", "RunResumed", run_name):
        assert part in svg, part
    panel = _mime(nb, "runpanel", "text/html")
    assert "tgnb-run-panel" in panel and "succeeded" in panel and "<svg" in panel
    # live widgets were displayed and their state saved with the notebook
    views = [
        o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for cid in ("scale", "watch")
        for o in _outputs(nb, cid)
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(views) == 2
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert set(views) <= set(state)
    labels = [
        m["state"].get("value", "") for m in state.values() if m["model_name"] == "LabelModel"
    ]
    assert any(re.match(r"allocated 16 / desired 16 GPUs", v) for v in labels), labels
    html = executed.html["quickstart"].read_text(encoding="utf-8")
    assert "tgnb-timeline" in html and "tgnb-run-panel" in html


def test_sweep_summary_table_plot_and_target_dropped(executed: Any) -> None:
    nb = executed.nb("grpo-sweep")
    params = executed.parameters["grpo-sweep"]
    session = _session(executed.home)
    runs = [r for r in session.runs() if r.name.startswith("sweep-")]
    assert len(runs) == len(params["learning_rates"])
    table = _mime(nb, "summary", "text/html")
    for run in runs:
        s = run.summary()
        assert (s["state"], s["steps"]) == ("succeeded", params["max_steps"])
        lr = run.record.spec.train.trl["learning_rate"]
        assert lr in params["learning_rates"]
        assert run.name in table
    assert _mime(nb, "plot", "image/png")
    dropped = "".join(_text(o) for o in _outputs(nb, "scale-down"))
    assert "preemptible: target 0" in dropped


def test_dpo_curves(executed: Any) -> None:
    nb = executed.nb("dpo")
    run = _session(executed.home).run(_run_name(nb, "launch"))
    s = run.summary()
    assert (s["state"], s["steps"]) == ("succeeded", executed.parameters["dpo"]["max_steps"])
    assert s["reward_key"] == "rewards/margins"
    assert "rewards/margins" in run.metrics().columns
    assert _mime(nb, "plot", "image/png")
    assert "tgnb-run-panel" in _mime(nb, "runpanel", "text/html")
    assert _session(executed.home).status().desired_preemptible_gpus == 0


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_the_api_key_leaks_nowhere(executed: Any) -> None:
    """The fake key was in every kernel's environment (and so in the environment of the daemon
    and the runs they started): it must not appear in any output notebook, HTML export, widget
    state, emulator log, run log, event or metrics file, or the run store."""
    for name in executed.parameters:
        executed.nb(name)  # each notebook ran to the end
    home_files = _files(executed.home)
    names = {p.name for p in home_files}
    assert {"emulator.log", "train.log", "supervisor.log", "events.jsonl", "runs.sqlite"} <= names
    scanned = [*_files(executed.out), *home_files]
    leaks = [str(p) for p in scanned if executed.fake_key.encode() in p.read_bytes()]
    assert not leaks, f"the API key appears in {leaks}"
    for name in executed.parameters:
        widgets = executed.nb(name).metadata.get("widgets", {})
        assert executed.fake_key not in json.dumps(widgets)


#: Text of a progress bar (tqdm): "12/30 [00:05<00:07, 2.4 step/s]" or a bar of blocks.
_PROGRESS = re.compile(r"\d+/\d+ \[|step/s|it/s|█")


def _blocks(page: str, mime: str) -> list[str]:
    """The text of each output area of one mime type in an nbconvert (lab template) page."""
    found = re.findall(rf'<div[^>]*data-mime-type="{re.escape(mime)}"[^>]*>(.*?)</div>', page, re.S)
    return [re.sub(r"<[^>]+>", "", b) for b in found]


def test_exports_read_cleanly(executed: Any) -> None:
    """Each HTML export as a newcomer reads it: progress is ordinary output, not a stderr block
    drawn as an error; no panel shows a run that has not started (each shows its cell's state,
    and the notebooks watch a run once it trains, or until it ends); the events are a table."""
    for name, html_path in executed.html.items():
        page = Path(html_path).read_text(encoding="utf-8")
        stderr = _blocks(page, "application/vnd.jupyter.stderr")
        progress = [b for b in stderr if _PROGRESS.search(b)]
        assert progress == [], f"{name}: progress drawn as stderr: {progress}"
        assert "not read yet" not in page, name
        for panel in re.findall(r"<div class=.tgnb-run-panel.>(.*?)</svg></div>", page, re.S):
            assert "pending" not in panel and "step 0 /" not in panel, (name, panel[:300])
    quick = Path(executed.html["quickstart"]).read_text(encoding="utf-8")
    assert "tgnb-run-panel" in quick and re.search(r"class=.tgnb-events.", quick)
    assert any(_PROGRESS.search(b) for b in _blocks(quick, "text/plain")), "run.wait()'s bar"
