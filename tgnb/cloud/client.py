"""The official `together` SDK client, built from `tgnb.config.Settings`, and what tgnb does around it.

- `make_client` builds ``together.Together(api_key=, base_url=, project_id=, timeout=,
  max_retries=)``, the one SDK client factory of every plane (`tgnb.connection.Endpoint` too); the SDK
  itself adds the ``/v1/...`` paths, so the base URL is the server root (a trailing ``/v1`` from the
  SDK 1.x habit is dropped).
- `translate` turns an SDK exception into the `tgnb.errors` hierarchy with a one-line message that
  says the cause and the remedy, and never the API key: the one translation of every plane (the
  clusters' `Cloud` here, Post-Training and the Tinker layer through `tgnb.connection.Endpoint`).
- `RetryPolicy.call` retries a call on rate limits, 5xx, timeouts and connection errors with bounded,
  growing pauses, on top of the SDK's own retries. Use it for idempotent calls only (reads, an
  absolute target, a delete).

The SDK is imported inside functions: ``import tgnb.cloud`` stays fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tgnb.config import Settings, register_secret, scrub
from tgnb.errors import (
    ApiError,
    ApiNotFoundError,
    AuthenticationError,
    ConfigError,
    TgnbError,
    TransientApiError,
    ValidationError,
)

if TYPE_CHECKING:
    from together import Together

T = TypeVar("T")

#: The Together API's root (the SDK's own default).
DEFAULT_BASE_URL = "https://api.together.ai"
#: Default seconds the SDK waits for one HTTP answer (the SDK's own default is 60 s).
DEFAULT_TIMEOUT = 30.0
#: Default retries the SDK itself makes for 408/409/429/5xx and timeouts (3 tries in all).
DEFAULT_SDK_RETRIES = 2


def normalize_base_url(url: str | None) -> str | None:
    """The server root the SDK expects: no trailing slash, no trailing ``/v1``."""
    if not url:
        return None
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url or None


def make_client(
    settings: Settings,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_retries: int = DEFAULT_SDK_RETRIES,
) -> Together:
    """A ``together.Together`` client for `settings` (key, base URL, project).

    Raises `ConfigError` when no API key is set: the SDK cannot call anything without one.
    """
    if settings.api_key is None or not settings.api_key:
        raise ConfigError(
            "no TOGETHER_API_KEY is set: export it, or start the local emulator "
            "(`tgnb emulator start`) and use the key and base URL it prints"
        )
    key = settings.api_key.get()
    register_secret(key)
    from together import Together

    return Together(
        api_key=key,
        # explicit, so the SDK does not read TOGETHER_BASE_URL behind the settings' back
        base_url=normalize_base_url(settings.base_url) or DEFAULT_BASE_URL,
        project_id=settings.project_id,
        timeout=timeout,
        max_retries=max_retries,
    )


def _one_line(text: str, limit: int = 200) -> str:
    text = scrub(" ".join(str(text).split()))  # mask first, then cut: no prefix of a key survives
    return text if len(text) <= limit else text[: limit - 3] + "..."


def server_message(body: object) -> str:
    """The human part of an error body: ``{code, message, details}`` or ``{error: {message}}``."""
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and err.get("message"):
            return _one_line(str(err["message"]))
        parts = []
        if body.get("message"):
            parts.append(str(body["message"]))
        details = body.get("details")
        if isinstance(details, list):
            for item in details:
                # the emulator repeats its message in `details`: say it once
                if isinstance(item, Mapping) and item.get("detail"):
                    said = " ".join(str(item["detail"]).split())
                    if all(said != " ".join(p.split()) for p in parts):
                        parts.append(str(item["detail"]))
        if parts:
            return _one_line("; ".join(parts))
        if isinstance(err, str):
            return _one_line(err)
        return ""
    if isinstance(body, str):
        return _one_line(body)
    return ""


def _make(cls: type[TgnbError], message: str, status: int | None = None) -> TgnbError:
    message = scrub(_one_line(message, limit=400))
    if issubclass(cls, ApiError):
        return cls(message, status_code=status)
    return cls(message)


#: What a 404 tells to look at, by default (the clusters plane).
CLUSTERS_LIST = "check the cluster id (Cloud.clusters() lists them)"


def translate(
    exc: BaseException,
    what: str = "the request",
    base_url: str | None = None,
    lists: str = CLUSTERS_LIST,
) -> TgnbError:
    """The `tgnb.errors` exception for an SDK exception raised while doing `what`.

    `what` names the operation in the user's words ("read cluster c-1", "set the preemptible
    target of c-1 to 16"); `lists`, the remedy of a 404 (what lists the things that exist). The
    SDK's native clients' own verdicts are translated too: a `RuntimeError` / `TimeoutError` (an
    operation FAILED, a terminal status while waiting) is an `ApiError`, a `ValueError` (its
    client-side checks) a `ValidationError`. The message never contains the API key.
    """
    import together

    if isinstance(exc, TgnbError):
        return exc
    where = f" at {base_url}" if base_url else ""
    if isinstance(exc, together.APIStatusError):
        status = exc.status_code
        detail = server_message(exc.body)
        said = f": {detail}" if detail else ""
        if status == 401:
            return _make(
                AuthenticationError,
                f"the API{where} refused TOGETHER_API_KEY (401) while trying to {what}: "
                "check the key, or run with no key to use the local emulator",
                status,
            )
        if status == 403:
            return _make(
                AuthenticationError,
                f"the API{where} denied access (403) while trying to {what}{said}: check that the key "
                "belongs to the project in TOGETHER_PROJECT_ID",
                status,
            )
        if status == 404:
            return _make(
                ApiNotFoundError, f"not found (404) while trying to {what}{said}: {lists}", status
            )
        if status == 429:
            return _make(
                TransientApiError,
                f"rate limited (429) while trying to {what}, even after retries: wait a minute "
                "and try again",
                status,
            )
        if status >= 500:
            return _make(
                TransientApiError,
                f"the API{where} failed ({status}) while trying to {what}{said}, even after retries: "
                "try again later",
                status,
            )
        return _make(
            ApiError,
            f"the API refused to {what} ({status}){said}: fix the request and retry",
            status,
        )
    if isinstance(exc, together.APITimeoutError):
        return _make(
            TransientApiError,
            f"no answer from the API{where} in time while trying to {what}, even after retries: "
            "try again, or pass a longer timeout",
        )
    if isinstance(exc, together.APIConnectionError):
        return _make(
            TransientApiError,
            f"could not connect to the API{where} while trying to {what}: check TOGETHER_BASE_URL "
            "and the network, or start the local emulator with `tgnb emulator start`",
        )
    if isinstance(exc, together.APIResponseValidationError):
        return _make(
            ApiError,
            f"the API{where} sent an answer tgnb does not understand while trying to {what}: "
            "check TOGETHER_BASE_URL points at a Together API",
        )
    if isinstance(exc, (RuntimeError, TimeoutError)) and not is_sdk_error(exc):
        return _make(ApiError, f"could not {what}: {exc}")
    if isinstance(exc, ValueError) and not is_sdk_error(exc):
        return _make(ValidationError, f"cannot {what}: {exc}")
    return _make(ApiError, f"the SDK failed while trying to {what}: {scrub(str(exc))}")


def raise_translated(
    exc: BaseException, what: str, base_url: str | None = None, lists: str = CLUSTERS_LIST
) -> NoReturn:
    """Raise `translate(exc)` without the SDK exception in its chain: the SDK's text quotes the
    server's raw answer, which may echo the key."""
    raise translate(exc, what, base_url, lists) from None


def is_sdk_error(exc: BaseException) -> bool:
    """Whether `exc` comes from the ``together`` SDK."""
    import together

    return isinstance(exc, together.TogetherError)


def is_transient(exc: BaseException) -> bool:
    """Whether trying again may help: 408/409/429/5xx, timeouts, connection errors."""
    import together

    if isinstance(exc, together.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return isinstance(exc, together.APIConnectionError)  # includes APITimeoutError


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with growing pauses, on top of the SDK's own, for idempotent calls only.

    `attempts` counts every try (1 means no retry); the pause before try n+1 is
    ``min(backoff * 2**(n-1), max_backoff)`` seconds.
    """

    attempts: int = 3
    backoff: float = 1.0
    max_backoff: float = 8.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    def pause(self, attempt: int) -> float:
        return float(min(self.backoff * 2 ** max(attempt - 1, 0), self.max_backoff))

    def call(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        base_url: str | None = None,
        on_retry: Callable[[BaseException], Any] | None = None,
        read_back: Callable[[], T | None] | None = None,
    ) -> T:
        """Run `fn`; retry transient SDK errors; translate the final error to `tgnb.errors`.

        `read_back`, for a call that must not be applied twice (sent with the SDK's retries off):
        after a transient error and the pause, it reads the state back; a result there means an
        earlier try went through before its answer was lost, so it is returned and nothing is
        sent again.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                return fn()
            except TgnbError:
                raise
            except Exception as exc:
                if not is_sdk_error(exc):
                    raise
                if attempt >= self.attempts or not is_transient(exc):
                    raise_translated(exc, what, base_url)
                if on_retry is not None:
                    on_retry(exc)
                self.sleep(self.pause(attempt))
                if read_back is not None:
                    found = read_back()
                    if found is not None:
                        return found
