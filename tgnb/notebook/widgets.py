"""Live panels: `ClusterPanel` (capacity, target against allocated, a target control, the nodes) and
`RunPanel` (steps, ETA, reward and loss curves with checkpoint, preemption and resume markers).

A panel polls on a daemon thread (`Poller`) and sets widget traits, so the kernel stays free; the
thread stops when the panel is closed or its run has finished. Each panel also renders itself as
static HTML (``text/html`` in its mime bundle, `snapshot()`), which is what papermill and nbconvert
outputs show where no widget state is saved. The base they share is `tgnb.notebook.panels`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as W

from tgnb import events as ev
from tgnb.markup import escape, plain
from tgnb.notebook._plot import curve_svg
from tgnb.notebook.panels import Panel, Poller, refresh_displays

if TYPE_CHECKING:
    from tgnb.cloud import Cluster, ClusterState
    from tgnb.runs import Run
    from tgnb.session import Session


class ClusterPanel(Panel):
    """Standard and preemptible capacity of the attached cluster, the preemptible target against
    what is allocated, a target control in steps of 8 that scales the cluster, and its nodes.

    `source` is a `tgnb.Session` (``status()``/``scale()``) or a `tgnb.cloud.Cluster`
    (``state()``/``scale()``).
    """

    def __init__(
        self,
        source: Session | Cluster,
        poll_interval: float = 2.0,
        start: bool = True,
        max_preemptible: int = 512,
    ) -> None:
        self.source = source
        self.state: Any = None
        self.header = W.HTML()
        self.progress = W.IntProgress(value=0, min=0, max=8, description="preemptible")
        self.progress_label = W.Label("")
        self.target = W.IntSlider(
            value=0,
            min=0,
            max=max_preemptible,
            step=8,
            description="target",
            continuous_update=False,
        )
        self.apply = W.Button(description="Scale", tooltip="set the preemptible target")
        self.apply.on_click(lambda _b: self._guard(self.scale_to_target))
        self.nodes = W.HTML()
        self.error = W.HTML()
        super().__init__(
            [
                self.header,
                W.HBox([self.progress, self.progress_label]),
                W.HBox([self.target, self.apply]),
                self.nodes,
                self.error,
            ]
        )
        self._poller = Poller(self.refresh, poll_interval, "tgnb-cluster-panel")
        if start:
            self._guard(self.refresh)
            self._poller.start()

    def _read(self) -> ClusterState:
        from tgnb.cloud import Cluster

        if isinstance(self.source, Cluster):
            return self.source.state()
        return self.source.status()

    def refresh(self) -> None:
        """Read the cluster now and show it."""
        self.update(self._read())

    def update(self, state: Any) -> None:
        """Show a `ClusterState` (also the callback of a scale that waits)."""
        first = self.state is None
        self.state = state
        desired, allocated = state.desired_preemptible_gpus, state.allocated_preemptible_gpus
        self.header.value = self._header_html()
        self.progress.max = max(desired, allocated, 1)
        self.progress.value = allocated
        self.progress.bar_style = "success" if allocated >= desired else "info"
        self.progress_label.value = f"allocated {allocated} / desired {desired} GPUs"
        if first:
            self.target.value = desired
        self.nodes.value = self._nodes_html()
        self.error.value = ""

    def scale_to_target(self) -> Any:
        """Set the preemptible target to the control's value (no waiting)."""
        result = self.source.scale(int(self.target.value))  # Session.scale waits only if asked
        self.refresh()
        return result

    def _header_html(self) -> str:
        s = self.state
        e = escape
        return (
            f"<b>{e(s.name)}</b> <code>{e(s.id)}</code> {e(s.type)} · {e(s.status)} · "
            f"{e(s.gpu_type)} {e(s.region)}<br>standard: {s.num_gpus} GPUs on "
            f"{_count(len(s.standard_nodes), 'node')} · preemptible: "
            f"{_count(len(s.preemptible_nodes), 'node')}"
        )

    def _nodes_html(self) -> str:
        e = escape
        rows = "".join(
            f"<tr><td>{e(n.name)}</td><td>{e(n.kind)}</td><td>{n.gpus}</td>"
            f"<td>{e(n.status)}</td><td>{e(n.phase or '')}</td></tr>"
            for n in self.state.nodes
        )
        return (
            "<table class='tgnb-nodes'><thead><tr><th>node</th><th>kind</th><th>GPUs</th>"
            f"<th>status</th><th>phase</th></tr></thead><tbody>{rows}</tbody></table>"
        )

    def to_html(self) -> str:
        if self.state is None:
            return "<div class='tgnb-cluster-panel'>cluster: not read yet</div>"
        s = self.state
        desired, allocated = s.desired_preemptible_gpus, s.allocated_preemptible_gpus
        pct = 100 if desired == 0 else min(100, round(100 * allocated / desired))
        bar = (
            f"<div style='width:240px;height:12px;background:#eee;display:inline-block'>"
            f"<div style='width:{pct}%;height:12px;background:#fc8d62'></div></div>"
        )
        return (
            f"<div class='tgnb-cluster-panel'>{self._header_html()}<br>"
            f"preemptible {bar} allocated {allocated} / desired {desired} GPUs"
            f"{self._nodes_html()}</div>"
        )


#: Metric names tried, in order, for the reward and the loss curves.
REWARD_KEYS = ("reward", "rewards/margins", "rewards/chosen", "train/reward")
LOSS_KEYS = ("loss", "train/loss")
#: For GRPO, whose loss sits near 0 by construction, the second curve is one of these instead.
GRPO_SPREAD_KEYS = ("kl", "reward_std")
#: Said under a GRPO run's curves (why its loss is not the one drawn).
GRPO_LOSS_NOTE = (
    "GRPO's loss sits near 0 by construction: each group's advantages are normalised to mean 0, "
    "so on-policy the loss averages 0 whatever the model learns. The second chart shows {key} "
    "instead (reward_std: the spread of rewards within a group, which sizes the update; 0 means "
    "no signal)."
)
_MARK_KINDS = {
    ev.CHECKPOINT_SAVED: "checkpoint",
    ev.SIGNAL_RECEIVED: "preemption",
    ev.DRAIN_NOTICE: "preemption",
    ev.RUN_RESUMED: "resume",
}


def _count(n: int, noun: str) -> str:
    """``1 resume``, ``2 resumes``, ``0 checkpoints``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _series(
    rows: list[dict[str, Any]], keys: tuple[str, ...]
) -> tuple[str, list[tuple[float, float]]]:
    for key in keys:
        pts = [
            (float(r["step"]), float(r[key]))
            for r in rows
            if "step" in r and isinstance(r.get(key), (int, float))
        ]
        if pts:
            return key, pts
    return keys[0], []


class RunPanel(Panel):
    """One run, live: a progress bar of optimizer steps with an ETA, reward and loss curves, and
    markers at checkpoints, preemptions (signal or drain notice) and resumes.

    `run` is a `tgnb.runs.Run` (``records("metrics")``, ``run_events()``, ``state``).
    """

    def __init__(self, run: Run, poll_interval: float = 2.0, start: bool = True) -> None:
        self.run = run
        self.header = W.HTML()
        self.progress = W.IntProgress(value=0, min=0, max=1, description="steps")
        self.progress_label = W.Label("")
        self.reward_plot = W.HTML()
        self.loss_plot = W.HTML()
        self.error = W.HTML()
        self.note = W.HTML()
        self.rows: list[dict[str, Any]] = []
        self.events: list[ev.Event] = []
        self.state = ""
        super().__init__(
            [
                self.header,
                W.HBox([self.progress, self.progress_label]),
                W.HBox([self.reward_plot, self.loss_plot]),
                self.note,
                self.error,
            ]
        )
        self._poller = Poller(self._tick, poll_interval, "tgnb-run-panel")
        if start:
            self._guard(self.refresh)
            if not self.finished:
                self._poller.start()

    @property
    def finished(self) -> bool:
        return self.state in ("succeeded", "failed", "cancelled")

    def _tick(self) -> bool:
        self._guard(self.refresh)
        return not self.finished

    def max_steps(self) -> int | None:
        value = self.run.max_steps()
        return int(value) if isinstance(value, int) else None

    def refresh(self) -> None:
        """Read the run's metrics, events and state now and show them."""
        state = self.run.state
        rows = self.run.records("metrics")
        self.error_line = self.run.error() if state.value == "failed" else None
        self.update(rows, self.run.run_events(), state.value)

    def update(self, rows: list[dict[str, Any]], events: list[ev.Event], state: str) -> None:
        self.rows, self.events, self.state = rows, events, state
        step, total = self.step(), self.max_steps()
        self.progress.max = max(total or step or 1, 1)
        self.progress.value = min(step, self.progress.max)
        self.progress.bar_style = {"succeeded": "success", "failed": "danger"}.get(state, "info")
        self.progress_label.value = self._progress_text()
        self.header.value = self._header_html()
        self.reward_plot.value, self.loss_plot.value = self._plots()
        self.note.value = self._note_html()

    def step(self) -> int:
        steps = [int(r["step"]) for r in self.rows if isinstance(r.get("step"), int)]
        return max(steps, default=0)

    def eta_seconds(self) -> float | None:
        """Seconds to `max_steps` at the rate of the last stretch of logged steps (None: unknown)."""
        total = self.max_steps()
        timed = [(r["step"], r["time"]) for r in self.rows if "time" in r and "step" in r][-20:]
        if total is None or len(timed) < 2 or timed[-1][0] <= timed[0][0]:
            return None
        rate = (timed[-1][1] - timed[0][1]) / (timed[-1][0] - timed[0][0])
        return max(total - timed[-1][0], 0) * rate

    def _progress_text(self) -> str:
        total = self.max_steps()
        text = f"step {self.step()}" + (f" / {total}" if total else "")
        eta = self.eta_seconds()
        if eta is not None and not self.finished:
            text += f" · ETA {int(eta // 60)}m{int(eta % 60):02d}s"
        text += f" · {self.state}"
        error = getattr(self, "error_line", None)
        return plain(f"{text}: {error}" if error and self.state == "failed" else text)

    def _header_html(self) -> str:
        e = escape
        restarts = sum(1 for x in self.events if x.reason == ev.RUN_RESUMED)
        ckpts = sum(1 for x in self.events if x.reason == ev.CHECKPOINT_SAVED)
        node = next((x.node for x in reversed(self.events) if x.node), None) or "-"
        kind = self.run.record.spec.train.algorithm
        return (
            f"<b>run {e(self.run.name)}</b> ({e(kind)}) · {e(self.state)} · node "
            f"{e(node)} · {_count(ckpts, 'checkpoint')} · {_count(restarts, 'resume')}"
            f"{e(self._cost_text())}"
        )

    def _cost_text(self) -> str:
        """`` · $0.42`` (`` of its $1.00 budget``) so far, from the events shown; ``""`` when no
        price is known."""
        from tgnb.prices import dollars
        from tgnb.runs.cost import run_cost

        prices = self.run.prices()
        if prices is None:
            return ""
        spec = self.run.record.spec
        gpus = spec.resources.gpus_per_node * spec.resources.nodes
        usd = run_cost(self.run.name, self.events, gpus).dollars(prices)
        budget = f" of its {dollars(spec.budget_usd)} budget" if spec.budget_usd else ""
        return f" · {dollars(usd)}{budget}"

    def markers(self) -> list[tuple[float, str]]:
        """(step, kind) of checkpoints, preemptions and resumes; a step taken from the event, else
        from the last metric logged before it."""
        timed = sorted((r["time"], r["step"]) for r in self.rows if "time" in r and "step" in r)
        out = []
        for x in self.events:
            kind = _MARK_KINDS.get(x.reason)
            if kind is None:
                continue
            step = x.data.get("step") if x.data else None
            if not isinstance(step, (int, float)):
                t = x.time.timestamp()
                before = [s for ts, s in timed if ts <= t]
                step = before[-1] if before else 0
            out.append((float(step), kind))
        return out

    def _second_keys(self) -> tuple[str, ...]:
        """What the second chart draws: the loss, or for GRPO a number that moves."""
        grpo = self.run.record.spec.train.algorithm == "grpo"
        moving = any(
            isinstance(r.get(k), (int, float)) for r in self.rows for k in GRPO_SPREAD_KEYS
        )
        return GRPO_SPREAD_KEYS if grpo and moving else LOSS_KEYS

    def _note_html(self) -> str:
        keys = self._second_keys()
        if keys is LOSS_KEYS:
            return ""
        key, _ = _series(self.rows, keys)
        note = escape(GRPO_LOSS_NOTE.format(key=key))
        return f"<div class='tgnb-note' style='max-width:720px;color:#555'>{note}</div>"

    def _plots(self) -> tuple[str, str]:
        marks = self.markers()
        rkey, reward = _series(self.rows, REWARD_KEYS)
        lkey, loss = _series(self.rows, self._second_keys())
        return (
            curve_svg(rkey, reward, marks, colour="#2ca02c"),
            curve_svg(lkey, loss, marks, colour="#d62728"),
        )

    def to_html(self) -> str:
        total = self.max_steps() or max(self.step(), 1)
        pct = min(100, round(100 * self.step() / total)) if total else 0
        bar = (
            f"<div style='width:240px;height:12px;background:#eee;display:inline-block'>"
            f"<div style='width:{pct}%;height:12px;background:#1f77b4'></div></div>"
        )
        reward, loss = self._plots()
        return (
            f"<div class='tgnb-run-panel'>{self._header_html()}<br>{bar} "
            f"{escape(self._progress_text())}<div>{reward}{loss}</div>{self._note_html()}</div>"
        )


__all__ = ["ClusterPanel", "Panel", "Poller", "RunPanel", "refresh_displays"]
