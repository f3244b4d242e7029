"""Where the Post-Training API answers and with which key, and the SDK errors it can raise,
translated to `tgnb.errors` with the key scrubbed.

`connect(local=True)` starts (or reuses) the local emulator daemon of the tgnb home and points the
SDK at it; `connect(local=False)` reads ``TOGETHER_API_KEY`` / ``TOGETHER_BASE_URL`` as the SDK does.
``together`` is imported inside functions, so ``import tgnb`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tgnb.cloud.client import (
    DEFAULT_BASE_URL,
    normalize_base_url,
    raise_translated,
    server_message,
)
from tgnb.config import Secret, Settings, register_secret, scrub
from tgnb.errors import ApiError, ConfigError, NotFoundError, TgnbError, ValidationError

if TYPE_CHECKING:
    from together import Together

T = TypeVar("T")

#: Seconds between the SDK's status polls while a resource or session comes up (local: short).
LOCAL_INTERVAL = 0.25
#: Platform time scale of an emulator started here (as `tgnb.attach(local=True)`'s): provisioning
#: and inactivity timeouts run 50x faster than on the service; `res.extend()` keeps a resource up.
LOCAL_TIME_SCALE = 0.02
REMOTE_INTERVAL = 10.0


@dataclass
class Connection:
    """The API root (no ``/v1``), its key, and whether it is the local emulator."""

    base_url: str
    api_key: Secret = field(repr=False)
    local: bool
    home: Path
    _client: Any = field(default=None, repr=False)

    @property
    def interval(self) -> float:
        return LOCAL_INTERVAL if self.local else REMOTE_INTERVAL

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
    local: bool = True, *, home: str | Path | None = None, time_scale: float | None = None
) -> Connection:
    """A `Connection` to the local emulator (started if needed) or to the real service."""
    settings = Settings.from_env()
    if home is not None:
        settings = Settings(
            settings.api_key, settings.project_id, settings.base_url, Path(home).expanduser()
        )
    if not local:
        if settings.api_key is None or not settings.api_key:
            raise ConfigError(
                "no TOGETHER_API_KEY is set: export it, or use tgnb.post_training(local=True) "
                "for the local emulator"
            )
        register_secret(settings.api_key.get())
        base = normalize_base_url(settings.base_url) or DEFAULT_BASE_URL
        return Connection(base, settings.api_key, False, settings.home)
    from tgnb.emulator import daemon

    # As `tgnb.attach`: a daemon already running for this home is reused whatever its time scale
    # unless one is asked; a mismatch with an asked one restarts it only if this command started it.
    st = daemon.status(settings.home)
    if time_scale is not None or not st.running:
        was = st.running
        options = daemon.ServeOptions.of(
            time_scale=LOCAL_TIME_SCALE if time_scale is None else time_scale
        )
        st, started = daemon.start(
            settings.home, options, asked=["time_scale"] if time_scale is not None else []
        )
        if started:
            print(
                f"{'restarted' if was else 'started'} the local emulator on {st.base_url} "
                f"(time scale {(st.options or {}).get('time_scale', options.fleet.time_scale):g}); "
                "`tgnb emulator stop` stops it"
            )
    if not (st.base_url and st.api_key):
        raise ConfigError(f"the local emulator under {st.home} did not say where it answers")
    return Connection(st.base_url, st.api_key, True, settings.home)


def _status_label(status: str | None) -> str:
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
            err: TgnbError = NotFoundError(
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
