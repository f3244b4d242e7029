"""What the preemption timeline draws: lanes of spans and markers, and their styles.

`tgnb.notebook.timeline` lays events out into these; `tgnb.notebook._svg` draws them. Both import
this module and neither imports the other at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tgnb import events as ev

#: Fill colours by span kind and marker shapes/colours by reason.
SPAN_STYLE = {
    "standard": "#8da0cb",
    "preemptible": "#fc8d62",
    "drain": "url(#tgnb-hatch)",
    "run": "#66c2a5",
    "occupied": "#1b9e77",
    # Post-Training: a model resource waiting for GPUs, then READY; its training sessions.
    "provisioning": "#d9d9d9",
    "resource": "#b3a2c7",
    "session": "#a6d854",
}
MARKER_STYLE: dict[str, tuple[str, str]] = {
    ev.RUN_STARTED: ("circle", "#1b9e77"),
    ev.RUN_RESUMED: ("up", "#1b9e77"),
    ev.CHECKPOINT_SAVED: ("circle", "#3366cc"),
    ev.CHECKPOINT_INTERVAL: ("diamond", "#3366cc"),
    ev.SIGNAL_RECEIVED: ("cross", "#d62728"),  # the program's SIGTERM: not the notice's shape
    ev.DRAIN_NOTICE: ("down", "#ff7f0e"),
    ev.RUN_REQUEUED: ("square", "#ff7f0e"),
    ev.RUN_EXITED: ("bar", "#222222"),
    ev.PREEMPTION_NOTIFIED: ("down", "#d62728"),
    ev.TARGET_CHANGED: ("diamond", "#7570b3"),
    ev.SCALED_UP: ("up", "#7570b3"),
    # What a workload backend records about a run's job (tgnb.backends.local.supervisor).
    ev.JOB_PLACED: ("circle", "#999999"),
    ev.JOB_RELEASED: ("bar", "#999999"),
    ev.SIGNAL_SENT: ("down", "#e377c2"),
    ev.JOB_KILLED: ("bar", "#d62728"),
    # The recovery policy's decisions (tgnb.runs.recovery): wait, shrink, standard nodes, back.
    ev.RECOVERY_DECIDED: ("diamond", "#e6ab02"),
    ev.RUN_FAILED_RESTARTING: ("square", "#d62728"),
    # A run's budget (tgnb.prices): the notice at 80 %, and the stop at the budget.
    ev.BUDGET_NOTICE: ("diamond", "#8c564b"),
    ev.BUDGET_REACHED: ("bar", "#8c564b"),
    ev.RESOURCE_CREATED: ("circle", "#7570b3"),
    ev.RESOURCE_QUEUED: ("square", "#bbbbbb"),
    ev.RESOURCE_READY: ("up", "#7570b3"),
    ev.RESOURCE_STOPPED: ("bar", "#222222"),
    ev.RESOURCE_ERROR: ("bar", "#d62728"),
    ev.SESSION_STARTED: ("circle", "#66a61e"),
    ev.SESSION_STOPPED: ("bar", "#222222"),
    ev.SESSION_EXPIRED: ("bar", "#ff7f0e"),
    ev.SESSION_ERROR: ("down", "#d62728"),
    ev.SESSION_CHECKPOINT: ("circle", "#3366cc"),
    ev.SESSION_ROLLED_BACK: ("down", "#ff7f0e"),
}
#: The marker of an event with no style of its own (a reason added later, a program's own).
OTHER = "other"
OTHER_STYLE = ("ring", "#555555")
OTHER_LABEL = "other event (hover for its name)"

LABEL = {
    ev.RUN_STARTED: "started",
    ev.RUN_RESUMED: "resumed",
    ev.CHECKPOINT_SAVED: "checkpoint",
    ev.CHECKPOINT_INTERVAL: "checkpoint interval",
    ev.SIGNAL_RECEIVED: "signal",
    ev.DRAIN_NOTICE: "drain notice",
    ev.RUN_REQUEUED: "requeued",
    ev.RUN_EXITED: "exited",
    ev.PREEMPTION_NOTIFIED: "preemption notice",
    ev.TARGET_CHANGED: "target changed",
    ev.SCALED_UP: "scaled up",
    ev.JOB_PLACED: "job placed",
    ev.JOB_RELEASED: "job released",
    ev.SIGNAL_SENT: "SIGTERM sent",
    ev.JOB_KILLED: "job killed",
    ev.RECOVERY_DECIDED: "recovery decision",
    ev.RUN_FAILED_RESTARTING: "failed, restarting",
    ev.BUDGET_NOTICE: "80 % of budget",
    ev.BUDGET_REACHED: "budget reached",
    ev.RESOURCE_CREATED: "resource created",
    ev.RESOURCE_QUEUED: "queued for GPUs",
    ev.RESOURCE_READY: "resource ready",
    ev.RESOURCE_STOPPED: "resource stopped",
    ev.RESOURCE_ERROR: "resource error",
    ev.SESSION_STARTED: "session started",
    ev.SESSION_STOPPED: "session stopped",
    ev.SESSION_EXPIRED: "session expired",
    ev.SESSION_ERROR: "session error",
    ev.SESSION_CHECKPOINT: "checkpoint",
    ev.SESSION_ROLLED_BACK: "rolled back",
}


@dataclass
class Span:
    """A stretch of time on a lane: a node's lifetime, a drain window, or a run on a node."""

    start: float
    end: float
    kind: str
    label: str = ""
    open: bool = False


@dataclass
class Marker:
    """One event (or several merged ones, `count`) at a point of a lane."""

    time: float
    reason: str
    label: str = ""
    count: int = 1


@dataclass
class Lane:
    """One row of the timeline: a node (``standard``/``preemptible``), a run, or the cluster."""

    key: str
    kind: str
    spans: list[Span] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
