"""One error hierarchy for tgnb. Every message says the cause and the remedy.

Messages never contain the API key: `TgnbError.__str__` scrubs any secret registered with
`tgnb.config.register_secret` before a message can reach a traceback, a log or a cell output.
"""

from __future__ import annotations


class TgnbError(Exception):
    """Base class of every error tgnb raises on purpose."""

    def __str__(self) -> str:
        from tgnb.config import scrub

        return scrub(super().__str__())


class ConfigError(TgnbError):
    """The local configuration (environment, tgnb home) is missing or wrong."""


class ValidationError(TgnbError, ValueError):
    """Bad input from the user; nothing was sent or changed."""


class ApiError(TgnbError):
    """The clusters API answered with an error that tgnb could not recover from."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class AuthenticationError(ApiError):
    """The API refused the key (401/403)."""


class NotFoundError(TgnbError, LookupError):
    """What was named does not exist: a run in the store, a cluster, a session, a Job. Raised by
    tgnb itself (a lookup) or, as `ApiNotFoundError`, by an API that answered 404."""


class ApiNotFoundError(ApiError, NotFoundError):
    """An API answered 404: an `ApiError` (with its `status_code`) and a `NotFoundError`."""


class AmbiguousNameError(ValidationError):
    """A name matched several objects; the message lists them."""


class TransientApiError(ApiError):
    """Rate limits, 5xx or timeouts that persisted through the SDK's retries."""


class EmulatorError(TgnbError):
    """The local emulator daemon could not be started, reached or stopped."""


class EmulatorMismatchError(EmulatorError):
    """A running emulator has other options than asked, and another command started it."""


class TrainConfigError(ValidationError):
    """A training configuration is invalid (unknown key, algorithm, reward, dataset, ...)."""


class CheckpointError(TgnbError):
    """A checkpoint could not be written or read."""


class BackendError(TgnbError):
    """A workload backend (local, Slurm, Kubernetes) failed."""


class NotPicklableError(ValidationError):
    """A function given to `Session.submit` or `Session.map`, or one of its arguments, cannot be
    sent to a node (it cannot be pickled, or it is a live object of this process: a lock, an open
    file, a socket); nothing was launched. The message names it and the fix."""


class CallError(TgnbError):
    """A submitted function's run ended without its value or its own exception (cancelled, its
    node's process killed, an exception that cannot be read back here); the message says how."""
