"""tgnb: JupyterLab as the cockpit for training on cheap, preemptible Together GPUs.

``import tgnb`` is light: it never imports torch, TRL, transformers or kubernetes. Heavy parts are
imported inside the functions that need them.
"""

from __future__ import annotations

from tgnb.config import Settings
from tgnb.errors import (
    AmbiguousNameError,
    ApiError,
    AuthenticationError,
    BackendError,
    CheckpointError,
    ConfigError,
    EmulatorError,
    NotFoundError,
    TgnbError,
    TrainConfigError,
    TransientApiError,
    ValidationError,
)
from tgnb.events import Event

__version__ = "0.1.0"

__all__ = [
    "AmbiguousNameError",
    "ApiError",
    "AuthenticationError",
    "BackendError",
    "CheckpointError",
    "ConfigError",
    "EmulatorError",
    "Event",
    "NotFoundError",
    "Settings",
    "TgnbError",
    "TrainConfigError",
    "TransientApiError",
    "ValidationError",
    "__version__",
]
