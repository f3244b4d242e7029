"""SDK exceptions become `tgnb.errors` with one-line messages naming cause and remedy, never the key.

SDK exceptions are constructed directly from ``httpx`` responses (what the SDK itself does), or come
from the real SDK talking to an ``httpx.MockTransport`` (the outermost HTTP boundary only).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
import together

from tgnb import errors
from tgnb.cloud import Cloud, translate
from tgnb.cloud.client import RetryPolicy, normalize_base_url, server_message
from tgnb.config import Secret, Settings

REQ = httpx.Request("GET", "http://api.test/v1/compute/clusters/c-1")


def status_error(code: int, body: object) -> together.APIStatusError:
    cls = {
        400: together.BadRequestError,
        401: together.AuthenticationError,
        403: together.PermissionDeniedError,
        404: together.NotFoundError,
        409: together.ConflictError,
        429: together.RateLimitError,
    }.get(code, together.InternalServerError)
    resp = httpx.Response(code, json=body, request=REQ)
    return cls(f"Error code: {code} - {body}", response=resp, body=body)


@pytest.mark.parametrize(
    ("exc", "cls", "fragments"),
    [
        (
            status_error(401, {"message": "bad key"}),
            errors.AuthenticationError,
            ["refused TOGETHER_API_KEY (401)", "check the key", "local emulator"],
        ),
        (
            status_error(403, {"message": "no"}),
            errors.AuthenticationError,
            ["denied access (403)", "TOGETHER_PROJECT_ID"],
        ),
        (
            status_error(404, {"code": 5, "message": "cluster not found", "details": []}),
            errors.ApiNotFoundError,  # an ApiError (status 404) and a NotFoundError
            ["not found (404)", "cluster not found"],
        ),
        (
            status_error(
                400,
                {
                    "code": 3,
                    "message": "invalid",
                    "details": [{"detail": "num_gpus must be a multiple of 8"}],
                },
            ),
            errors.ApiError,
            ["(400)", "num_gpus must be a multiple of 8"],
        ),
        (
            status_error(429, {"error": {"message": "slow down"}}),
            errors.TransientApiError,
            ["rate limited (429)", "wait a minute"],
        ),
        (
            status_error(503, "unavailable"),
            errors.TransientApiError,
            ["failed (503)", "try again later"],
        ),
        (together.APITimeoutError(REQ), errors.TransientApiError, ["no answer", "longer timeout"]),
        (
            together.APIConnectionError(request=REQ),
            errors.TransientApiError,
            ["could not connect", "TOGETHER_BASE_URL", "tgnb emulator start"],
        ),
    ],
)
def test_translation(exc: Exception, cls: type[Exception], fragments: list[str]) -> None:
    err = translate(exc, "read cluster c-1", "http://api.test")
    assert type(err) is cls
    msg = str(err)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    if isinstance(err, errors.ApiError) and isinstance(exc, together.APIStatusError):
        assert err.status_code == exc.status_code


def test_key_echoed_by_server_is_scrubbed(test_key: str) -> None:
    KEY = test_key
    Secret(KEY)  # registers the key, as Settings.from_env does
    exc = status_error(400, {"message": f"the key {KEY} is odd"})
    err = translate(exc, "list clusters")
    assert KEY not in str(err) and KEY not in repr(err)
    assert "***" in str(err)


def test_server_message_shapes() -> None:
    assert server_message({"error": {"message": "x"}}) == "x"
    assert server_message({"message": "a", "details": [{"detail": "b"}]}) == "a; b"
    assert server_message("line one\nline two") == "line one line two"
    assert server_message(None) == ""


def test_base_url_normalized() -> None:
    assert normalize_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert normalize_base_url("https://api.together.ai") == "https://api.together.ai"
    assert normalize_base_url("") is None


def test_no_key_is_a_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="no TOGETHER_API_KEY"):
        Cloud(Settings(api_key=None, base_url="http://api.test"))


def test_retry_policy_retries_transient_then_succeeds() -> None:
    calls: list[int] = []
    pauses: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise status_error(503, "busy")
        return "ok"

    policy = RetryPolicy(attempts=3, backoff=0.5, max_backoff=0.75, sleep=pauses.append)
    assert policy.call(flaky, what="list clusters") == "ok"
    assert len(calls) == 3
    assert pauses == [0.5, 0.75]


def test_retry_policy_is_bounded_and_skips_permanent_errors() -> None:
    calls: list[int] = []

    def always(code: int) -> Callable[[], None]:
        def fn() -> None:
            calls.append(code)
            raise status_error(code, "x")

        return fn

    policy = RetryPolicy(attempts=4, backoff=0, sleep=lambda _s: None)
    with pytest.raises(errors.TransientApiError):
        policy.call(always(429), what="list clusters")
    assert calls.count(429) == 4
    with pytest.raises(errors.NotFoundError):
        policy.call(always(404), what="read cluster x")
    assert calls.count(404) == 1


def test_wrong_key_through_the_sdk(
    mock_cloud: Callable[..., tuple[Cloud, object]], test_key: str
) -> None:
    KEY = test_key

    def handler(request: httpx.Request) -> httpx.Response:
        auth = request.headers["authorization"]
        return httpx.Response(
            401, json={"code": 16, "message": f"invalid key {auth}", "details": []}
        )

    cloud, rec = mock_cloud(handler)
    with pytest.raises(errors.AuthenticationError) as info:
        cloud.attach("train")
    assert KEY not in str(info.value) and KEY not in repr(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert "check the key" in str(info.value)
    assert len(rec.requests) == 1  # 401 is not retried


def test_not_found_is_its_own_error_and_a_404_is_both() -> None:
    """A lookup that finds nothing (the run store, a name) is a `NotFoundError`, not an API
    error; the API's 404 is an `ApiNotFoundError`: caught as either."""
    assert not issubclass(errors.NotFoundError, errors.ApiError)
    err = translate(status_error(404, {"message": "cluster not found"}), "read cluster c-1")
    assert isinstance(err, errors.NotFoundError) and isinstance(err, errors.ApiError)
    assert isinstance(err, errors.ApiError) and err.status_code == 404
