"""`ResourcePanel`: a live view of one Post-Training model resource.

One line per training session (status, step, loss, reward mean, policy version, operations,
checkpoints), the sessions' loss and reward curves on shared axes (so several LoRA runs compare at a
glance), and the resource's GPU-minutes and cost so far. It polls on a daemon thread (`Poller`)
until the resource stops or the panel is closed, and renders itself as static HTML (``text/html``,
`snapshot()`) for papermill and HTML exports, showing the latest state.

Losses, steps and operations come from the sessions' client-side metric logs
(`tgnb.posttraining.metrics`, written by ``sess.trainer`` and ``sess.record``); statuses, policy
versions and checkpoints from the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W

from tgnb.markup import escape
from tgnb.notebook._pt_plot import colour, multi_curve_svg
from tgnb.notebook.widgets import Panel, Poller
from tgnb.prices import money

#: Metrics drawn, first found wins (reward names the recipes use).
REWARD_KEYS = ("reward_mean", "reward", "mean_reward", "accuracy")


@dataclass
class PanelState:
    """What the panel shows: the resource, its sessions, each session's metric records, the cost."""

    resource: Any  # tgnb.posttraining.ResourceInfo
    sessions: list[Any] = field(default_factory=list)  # SessionInfo
    metrics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # session id -> rows
    cost: Any = None  # tgnb.posttraining.Cost


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [
        (float(r["step"]), float(r[key]))
        for r in rows
        if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float))
    ]


def _reward_key(state: PanelState) -> str:
    for key in REWARD_KEYS:
        if any(_series(rows, key) for rows in state.metrics.values()):
            return key
    return REWARD_KEYS[0]


def _latest(rows: list[dict[str, Any]], key: str) -> str:
    s = _series(rows, key)
    return f"{s[-1][1]:.4g}" if s else "-"


def session_rows(state: PanelState) -> list[tuple[str, ...]]:
    """One row per session: SESSION, STATUS, STEP, LOSS, REWARD, POLICY, OPS, CKPTS, LORA."""
    reward = _reward_key(state)
    out: list[tuple[str, ...]] = []
    for s in state.sessions:
        rows = state.metrics.get(s.id, [])
        steps = [int(r["step"]) for r in rows if isinstance(r.get("step"), int)]
        ops = sum(1 for r in rows if "op" in r)
        lora = f"r{s.lora_rank}" if s.lora_rank else "full"
        out.append(
            (
                s.label,
                s.status,
                str(max([s.step, *steps])),
                _latest(rows, "loss"),
                _latest(rows, reward),
                str(s.policy_version),
                str(ops) if ops else "-",  # "-": not sent through tgnb's trainer, not known
                str(len(s.checkpoints)),
                lora,
            )
        )
    return out


HEAD = ("SESSION", "STATUS", "STEP", "LOSS", "REWARD", "POLICY", "OPS", "CKPTS", "LORA")


def header_text(state: PanelState) -> str:
    r = state.resource
    parts = [f"resource {r.id}", r.base_model, r.status, f"{r.generators} generator(s)"]
    if r.queue_position is not None:
        parts.append(f"queue position {r.queue_position}")
    c = state.cost
    if c is not None:
        est = " (est.)" if c.estimated else ""
        clock = " (platform)" if c.unit != "min" else ""
        parts.append(f"{c.gpu_minutes:.1f} GPU-min{clock}{est}")
        parts.append(f"{money(c.amount, c.currency)} so far")
        if c.unit != "min":
            parts.append(f"({c.clock_note})")
    return " · ".join(parts)


def table_html(state: PanelState) -> str:
    e = escape
    rows = session_rows(state)
    if not rows:
        return "<div>no sessions yet: res.open_session(lora={'rank': 8})</div>"
    pad = "style='padding:2px 10px 2px 0;text-align:left'"
    head = "".join(f"<th {pad}>{e(h.lower())}</th>" for h in HEAD)
    body = ""
    for i, row in enumerate(rows):
        swatch = f"<span style='color:{colour(i)}'>■</span> "
        cells = "".join(f"<td {pad}>{e(v)}</td>" for v in row[1:])
        body += f"<tr><td {pad}>{swatch}{e(row[0])}</td>{cells}</tr>"
    return (
        f"<table class='tgnb-table tgnb-pt-sessions'><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def plots_html(state: PanelState) -> tuple[str, str]:
    reward = _reward_key(state)
    names = [s.label for s in state.sessions]
    labels = {
        s.id: s.label if names.count(s.label) == 1 else f"{s.label} ({s.id[-6:]})"
        for s in state.sessions
    }
    # In the sessions' order, so each keeps the colour of its table row.
    order = [s.id for s in state.sessions if s.id in state.metrics]
    loss = {labels[sid]: _series(state.metrics[sid], "loss") for sid in order}
    rew = {labels[sid]: _series(state.metrics[sid], reward) for sid in order}
    return multi_curve_svg("loss", loss), multi_curve_svg(reward.replace("_", " "), rew)


def render_html(state: PanelState) -> str:
    """The whole panel as static HTML (what papermill / nbconvert outputs keep)."""
    loss, reward = plots_html(state)
    return (
        f"<div class='tgnb-pt-panel'><b>{escape(header_text(state))}</b>"
        f"{table_html(state)}<div>{loss}{reward}</div></div>"
    )


def render_text(state: PanelState) -> str:
    rows = session_rows(state)
    lines = [header_text(state)]
    all_rows = [HEAD, *rows]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(HEAD))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in all_rows]
    return "\n".join(line.rstrip() for line in lines)


def read_state(resource: Any) -> PanelState:
    """The resource's state now, through the Python API (`tgnb.posttraining.Resource`)."""
    from tgnb.posttraining.metrics import metrics_dir, read

    info = resource.info()
    sessions = resource.sessions()
    where = metrics_dir(resource.conn.home)
    metrics = {s.id: read(where / f"{s.id}.jsonl") for s in sessions}
    try:
        cost = resource.cost()
    except Exception:  # the price is a nicety: the panel still shows the sessions without it
        cost = None
    return PanelState(info, sessions, metrics, cost)


class ResourcePanel(Panel):
    """Sessions, shared-axes curves and cost of one model resource, refreshed every
    `poll_interval` seconds until it stops (``start=False``: drawn once, not refreshed, e.g. to
    leave the final state in an exported notebook). `resource` is a `tgnb.posttraining.Resource`."""

    def __init__(self, resource: Any, poll_interval: float = 2.0, start: bool = True) -> None:
        self.resource = resource
        self.state: PanelState | None = None
        self.header = W.HTML()
        self.table = W.HTML()
        self.loss_plot = W.HTML()
        self.reward_plot = W.HTML()
        self.error = W.HTML()
        super().__init__(
            [self.header, self.table, W.HBox([self.loss_plot, self.reward_plot]), self.error]
        )
        self._poller = Poller(self._tick, poll_interval, "tgnb-pt-panel")
        self._guard(self.refresh)  # shown at once; `start=False` only keeps it from polling
        if start and not self.finished:
            self._poller.start()

    @property
    def finished(self) -> bool:
        return self.state is not None and not self.state.resource.active

    def _tick(self) -> bool:
        self._guard(self.refresh)
        return not self.finished

    def refresh(self) -> None:
        """Read the resource, its sessions, their metrics and the cost now, and show them."""
        self.update(read_state(self.resource))

    def update(self, state: PanelState) -> None:
        self.state = state
        self.header.value = f"<b>{escape(header_text(state))}</b>"
        self.table.value = table_html(state)
        self.loss_plot.value, self.reward_plot.value = plots_html(state)
        self.error.value = ""

    def to_html(self) -> str:
        if self.state is None:
            return f"<div class='tgnb-pt-panel'>resource {escape(self.resource.id)}</div>"
        return render_html(self.state)

    def __repr__(self) -> str:
        if self.state is None:
            return f"ResourcePanel({self.resource.id})"
        return render_text(self.state)

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        data = super()._repr_mimebundle_(**kwargs)
        data["text/plain"] = repr(self)
        return data


__all__ = ["HEAD", "PanelState", "ResourcePanel", "read_state", "render_html", "render_text"]
