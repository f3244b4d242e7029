"""`RestClient`'s surface (tinker 0.38's public members: each served or refused with why) and its
argument checks: every bad argument is one line naming the fix, raised before any request (the
client points at a port nothing listens on, so a request would be a connection error)."""

from __future__ import annotations

import asyncio
import inspect
from importlib.metadata import version
from typing import Any

import pytest

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
from tgnb.errors import ValidationError
from tgnb.tinker._rest import REFUSED, SERVED, RestClient

#: tinker 0.38.0's ``RestClient`` public members and their parameters, as
#: ``inspect.signature`` reads them (``pip install tinker==0.38.0``); the walk below reads the
#: installed tinker's when it is 0.38 or newer.
TINKER_038 = {
    "assign_session_project": ("session_id", "project_id"),
    "assign_session_project_async": ("session_id", "project_id"),
    "copy_weights": ("path", "destination_project_id", "ttl_seconds", "weights_access_token"),
    "copy_weights_async": ("path", "destination_project_id", "ttl_seconds", "weights_access_token"),
    "delete_checkpoint": ("training_run_id", "checkpoint_id"),
    "delete_checkpoint_async": ("training_run_id", "checkpoint_id"),
    "delete_checkpoint_from_tinker_path": ("tinker_path",),
    "delete_checkpoint_from_tinker_path_async": ("tinker_path",),
    "export_session_trace": ("session_id",),
    "export_session_trace_async": ("session_id",),
    "get_audit_log": ("event_type", "day"),
    "get_audit_log_async": ("event_type", "day"),
    "get_billing_usage": ("starting_on", "ending_before"),
    "get_billing_usage_async": ("starting_on", "ending_before"),
    "get_current_checkpoint_storage_usage": ("project_id",),
    "get_current_checkpoint_storage_usage_async": ("project_id",),
    "get_external_weights_urls": ("tinker_path",),
    "get_external_weights_urls_async": ("tinker_path",),
    "get_sampler": ("sampler_id",),
    "get_sampler_async": ("sampler_id",),
    "get_server_capabilities": (),
    "get_session": ("session_id", "access_scope"),
    "get_session_async": ("session_id", "access_scope"),
    "get_telemetry": (),
    "get_training_run": ("training_run_id", "access_scope"),
    "get_training_run_async": ("training_run_id", "access_scope"),
    "get_training_run_by_tinker_path": ("tinker_path", "access_scope"),
    "get_training_run_by_tinker_path_async": ("tinker_path", "access_scope"),
    "get_weights_info_by_tinker_path": ("tinker_path",),
    "list_checkpoints": ("training_run_id",),
    "list_checkpoints_async": ("training_run_id",),
    "list_sessions": ("limit", "offset", "access_scope"),
    "list_sessions_async": ("limit", "offset", "access_scope"),
    "list_training_runs": ("limit", "offset", "access_scope", "project_id"),
    "list_training_runs_async": ("limit", "offset", "access_scope", "project_id"),
    "list_user_checkpoints": ("limit", "offset"),
    "list_user_checkpoints_async": ("limit", "offset"),
    "publish_checkpoint_from_tinker_path": ("tinker_path",),
    "publish_checkpoint_from_tinker_path_async": ("tinker_path",),
    "search_sessions": ("request",),
    "set_checkpoint_ttl_from_tinker_path": ("tinker_path", "ttl_seconds"),
    "set_checkpoint_ttl_from_tinker_path_async": ("tinker_path", "ttl_seconds"),
    "unpublish_checkpoint_from_tinker_path": ("tinker_path",),
    "unpublish_checkpoint_from_tinker_path_async": ("tinker_path",),
    "whoami": (),
}

PATH = "tinker://0f3c/sampler_weights/ck-1"


@pytest.fixture
def rest(monkeypatch: pytest.MonkeyPatch) -> RestClient:
    """A client of a port nothing listens on, never retried: any request is an error other
    than the ones the checks raise."""
    monkeypatch.setenv("TOGETHER_MAX_RETRIES", "0")
    return RestClient(api_key="tok-not-a-real-key", base_url="http://127.0.0.1:9/v1")


def _walk(surface: dict[str, tuple[str, ...]], rest: RestClient) -> None:
    for name, params in surface.items():
        ours = getattr(rest, name)  # every member is there
        base = name.removesuffix("_async")
        if base in REFUSED:
            with pytest.raises(NotImplementedError) as refused:
                result = ours(*[None] * len(params))
                if inspect.isawaitable(result):
                    asyncio.run(result)
            line = str(refused.value)
            assert line.startswith(f"RestClient.{name}: ") and "\n" not in line, line
            assert len(line) > len(f"RestClient.{name}: ") + 20  # says what Post-Training lacks
        else:
            assert base in SERVED or name == "get_telemetry", name
            got = tuple(p for p in inspect.signature(ours).parameters if p != "self")
            assert got == params, (name, got)
            if name.endswith("_async"):  # a coroutine function, marked as tinker 0.38 marks its
                # deprecated twins (a function that warns at the call, then answers a coroutine)
                assert asyncio.iscoroutinefunction(ours), name


def test_tinker_038s_rest_surface_is_served_or_refused_with_why(rest: RestClient) -> None:
    _walk(TINKER_038, rest)
    assert rest.get_telemetry() is None


def test_the_installed_tinkers_rest_surface_when_it_is_038_or_newer(rest: RestClient) -> None:
    installed = tuple(int(x) for x in version("tinker").split(".")[:2])
    if installed < (0, 38):
        pytest.skip(f"tinker {version('tinker')} is older than 0.38: its surface is smaller")
    from tinker.lib.public_interfaces.rest_client import RestClient as Genuine

    surface = {
        name: tuple(p for p in inspect.signature(getattr(Genuine, name)).parameters if p != "self")
        for name in dir(Genuine)
        if not name.startswith("_")
    }
    _walk(surface, rest)


BAD: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
    ("list_checkpoints", ("",), {}, ValidationError, "training_run_id is empty: pass"),
    ("list_checkpoints", ("  ",), {}, ValidationError, "training_run_id is empty"),
    ("list_checkpoints", (None,), {}, TypeError, "training_run_id must be a string"),
    ("list_checkpoints", (PATH,), {}, ValidationError, "is a path, not a training run id"),
    ("list_user_checkpoints", (-1,), {}, ValidationError, "limit must be 1 or more, not -1"),
    ("list_user_checkpoints", (0,), {}, ValidationError, "limit must be 1 or more, not 0"),
    ("list_user_checkpoints", (), {"offset": -3}, ValidationError, "offset must be 0 or more"),
    ("list_user_checkpoints", ("10",), {}, TypeError, "limit must be an integer, not str"),
    ("list_user_checkpoints", (True,), {}, TypeError, "limit must be an integer, not bool"),
    ("list_user_checkpoints", (), {"offset": 1.5}, TypeError, "offset must be an integer"),
    ("get_external_weights_urls", ("",), {}, ValidationError, "tinker_path is empty: pass"),
    ("get_external_weights_urls", (7,), {}, TypeError, "tinker_path must be a string"),
    ("get_external_weights_urls", ("tinker://x/y",), {}, ValidationError, "not a checkpoint"),
    ("set_checkpoint_ttl_from_tinker_path", (PATH, -5), {}, ValidationError, "1 or more"),
    ("set_checkpoint_ttl_from_tinker_path", (PATH, "1h"), {}, TypeError, "ttl_seconds must be"),
    ("set_checkpoint_ttl_from_tinker_path", (None, 60), {}, TypeError, "tinker_path must be"),
    ("get_weights_info_by_tinker_path", ("",), {}, ValidationError, "tinker_path is empty"),
    ("get_training_run", ("",), {}, ValidationError, "training_run_id is empty"),
    ("get_training_run", ("r",), {"access_scope": "mine"}, ValidationError, "'owned' or"),
    ("get_training_run_by_tinker_path", (b"x",), {}, TypeError, "must be a string"),
    ("list_training_runs", (-1,), {}, ValidationError, "limit must be 1 or more"),
    ("list_training_runs", (), {"offset": -1}, ValidationError, "offset must be 0 or more"),
    ("list_training_runs", (), {"project_id": "p"}, ValidationError, "leave project_id out"),
]


@pytest.mark.parametrize(("call", "args", "kwargs", "error", "says"), BAD)
def test_a_bad_argument_is_one_line_naming_the_fix_before_any_request(
    rest: RestClient,
    call: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    error: type[Exception],
    says: str,
) -> None:
    with pytest.raises(error) as raised:
        getattr(rest, call)(*args, **kwargs)
    line = str(raised.value)
    assert line.startswith(f"RestClient.{call}: ") and says in line and "\n" not in line, line
    with pytest.raises(error, match=says):  # the _async twin checks the same, as early
        asyncio.run(getattr(rest, f"{call}_async")(*args, **kwargs))


def test_the_clients_own_arguments_are_checked_when_it_is_made() -> None:
    with pytest.raises(TypeError, match="RestClient: api_key must be a string"):
        RestClient(api_key=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="RestClient: base_url must be a string"):
        RestClient(api_key="k", base_url=5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="is not an http\\(s\\) URL"):
        RestClient(api_key="k", base_url="api.together.xyz")
    with pytest.raises(TypeError, match=r"takes base_url and api_key only, not api_kye: drop"):
        RestClient(api_kye="k")  # a misspelt keyword: refused, as tinker's RestClient refuses it
    RestClient(None, api_key="k", base_url="http://127.0.0.1:9/v1")  # tinker's holder: ignored
