"""tgnb: JupyterLab as the cockpit for training on cheap, preemptible Together GPUs.

``import tgnb`` is light: it never imports torch, TRL, transformers or kubernetes. Heavy parts are
imported inside the functions that need them.
"""

from __future__ import annotations

from typing import Any

from tgnb.config import Settings
from tgnb.errors import (
    AmbiguousNameError,
    ApiError,
    ApiNotFoundError,
    AuthenticationError,
    BackendError,
    CallError,
    CheckpointError,
    ConfigError,
    EmulatorError,
    EmulatorMismatchError,
    NotFoundError,
    NotPicklableError,
    TgnbError,
    TrainConfigError,
    TransientApiError,
    ValidationError,
)
from tgnb.events import Event

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`attach`, `Session` and `post_training` are imported on first use, so ``import tgnb``
    stays light."""
    if name in ("attach", "Session"):
        from tgnb import session

        return getattr(session, name)
    if name == "post_training":
        from tgnb.posttraining import post_training

        return post_training
    raise AttributeError(f"module 'tgnb' has no attribute {name!r}")


__all__ = [
    "AmbiguousNameError",
    "ApiError",
    "ApiNotFoundError",
    "AuthenticationError",
    "BackendError",
    "CallError",
    "CheckpointError",
    "ConfigError",
    "EmulatorError",
    "EmulatorMismatchError",
    "Event",
    "NotFoundError",
    "NotPicklableError",
    "Session",
    "Settings",
    "TgnbError",
    "TrainConfigError",
    "TransientApiError",
    "ValidationError",
    "__version__",
    "attach",
    "panel",
    "post_training",
    "timeline",
]


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext tgnb``: register the ``%tg`` magics (imported here, not by ``import tgnb``)."""
    from tgnb.notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from tgnb.notebook.magics import unload_ipython_extension as unload

    unload(ipython)


def timeline(events: Any, **options: Any) -> Any:
    """An `tgnb.notebook.timeline.EventTimeline` of events, or of a Session's, a Run's or a
    Post-Training resource's events."""
    from tgnb.notebook.timeline import timeline as build

    return build(events, **options)


def panel(resource: object, poll_interval: float = 2.0, start: bool = True) -> object:
    """A live `tgnb.notebook.pt_panel.ResourcePanel` of a Post-Training resource: one line per
    session, their curves on shared axes, GPU-minutes and cost (static HTML where widgets don't
    run; ``start=False`` draws it once without polling)."""
    from tgnb.notebook.pt_panel import ResourcePanel

    return ResourcePanel(resource, poll_interval=poll_interval, start=start)
