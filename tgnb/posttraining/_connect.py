"""Where the Post-Training API answers and with which key, and the SDK errors it can raise,
translated to `tgnb.errors` with the key scrubbed.

`connect` finds where the API answers through `tgnb.connection` (the default `tgnb.attach` shares:
the local emulator when no ``TOGETHER_API_KEY`` is set, else Together; ``local=True`` the
emulator, ``local=False`` Together as the SDK reads its environment). ``together`` is imported
inside functions, so ``import tgnb`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tgnb import connection
from tgnb.cloud.client import (
    DEFAULT_BASE_URL,
    normalize_base_url,
    raise_translated,
    server_message,
)
from tgnb.config import Secret, register_secret, scrub
from tgnb.connection import Emulator
from tgnb.errors import ApiError, ApiNotFoundError, TgnbError, ValidationError

if TYPE_CHECKING:
    from together import Together

T = TypeVar("T")


@dataclass
class Connection:
    """The API root (no ``/v1``), its key, the tgnb home, the seconds between the SDK's status
    polls while a resource or session comes up, and the emulator's own operations (None on the
    service). `seen_ready`: when this connection saw each resource become READY (the real API
    does not report it)."""

    base_url: str
    api_key: Secret = field(repr=False)
    home: Path
    interval: float = connection.REMOTE_POLL
    emulator: Emulator | None = None
    seen_ready: dict[str, datetime] = field(default_factory=dict, repr=False)
    _client: Any = field(default=None, repr=False)

    @property
    def where(self) -> str:
        """``the local emulator`` or ``Together``."""
        return "the local emulator" if self.emulator is not None else "Together"

    def native(self) -> dict[str, Any]:
        """The ``api_key=`` / ``base_url=`` keywords of the SDK's native clients."""
        return {"api_key": self.api_key.get(), "base_url": self.base_url}

    def sdk(self) -> Together:
        """A plain ``together.Together`` client (lists, checkpoints, estimate-cost, download);
        5 SDK retries on 408/409/429/5xx, as reads are safe to repeat."""
        if self._client is None:
            from together import Together

            self._client = Together(
                api_key=self.api_key.get(), base_url=self.base_url, timeout=60.0, max_retries=5
            )
        return self._client

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run an SDK call; any SDK failure becomes a `tgnb.errors` exception about `what`."""
        try:
            return fn()
        except TgnbError:
            raise
        except Exception as exc:
            fail(exc, what, self.base_url)

    def metrics_dir(self) -> Path:
        """Where client-side session metrics are kept (one JSONL file per session)."""
        return self.home / "posttraining" / "metrics"


def connect(
    local: bool | None = None, *, home: str | Path | None = None, time_scale: float | None = None
) -> Connection:
    """A `Connection` to the local emulator (started if needed) or to the real service
    (`tgnb.connection.connect`: the same default as `tgnb.attach`)."""
    end = connection.connect(local, home=home, time_scale=time_scale)
    assert end.api_key is not None  # connect refuses a missing key
    if end.emulator is None:
        register_secret(end.api_key.get())
    base = normalize_base_url(end.base_url) or DEFAULT_BASE_URL
    return Connection(base, end.api_key, end.home, end.poll, end.emulator)


def status_label(status: str | None) -> str:
    """``MODEL_RESOURCES_STATUS_READY`` -> ``READY``."""
    if not status:
        return "-"
    for prefix in (
        "MODEL_RESOURCES_STATUS_",
        "TRAINING_SESSION_STATUS_",
        "TRAINING_OPERATION_STATUS_",
        "CHECKPOINT_TYPE_",
    ):
        if status.startswith(prefix):
            return status[len(prefix) :]
    return status


def fail(exc: BaseException, what: str, base_url: str | None = None) -> NoReturn:
    """Raise the `tgnb.errors` exception for `exc` (an SDK or SDK-client failure)."""
    import together

    if isinstance(exc, together.APIStatusError) and exc.status_code in (400, 404, 409, 422):
        body = exc.body
        said = body.get("message") if isinstance(body, dict) else None
        # the emulator repeats its message in `details`: say it once
        detail = (
            " ".join(str(said).split()) if said else server_message(body)
        ) or f"HTTP {exc.status_code}"
        if exc.status_code == 404:
            err: TgnbError = ApiNotFoundError(
                scrub(
                    f"not found (404) while trying to {what}: {detail}; "
                    "pt.resources() / res.sessions() / res.checkpoints() list what exists"
                ),
                status_code=404,
            )
        else:
            err = ApiError(
                scrub(f"the API refused to {what} ({exc.status_code}): {detail}"),
                status_code=exc.status_code,
            )
        raise err from None
    if isinstance(exc, together.TogetherError):
        raise_translated(exc, what, base_url)
    if isinstance(exc, (RuntimeError, TimeoutError)):
        # The native clients' own verdicts: an operation FAILED, a terminal status while waiting.
        text = " ".join(str(exc).split())
        raise ApiError(scrub(f"could not {what}: {text}")) from None
    if isinstance(exc, ValueError):  # the SDK's client-side checks (tensors, losses, filenames)
        raise ValidationError(scrub(f"cannot {what}: {exc}")) from None
    raise exc


__all__ = ["Connection", "connect", "fail"]


def download(conn: Connection, checkpoint_id: str, variant: str, out: Path) -> list[Path]:
    """The SDK's ``download_checkpoint`` into `out` (checked: id, variant, directory)."""
    from together.post_training import download_checkpoint

    return conn.call(
        lambda: download_checkpoint(
            conn.sdk(),
            checkpoint_id,
            variant=variant,  # type: ignore[arg-type]
            output_dir=out,
        ),
        f"download checkpoint {checkpoint_id}",
    )
