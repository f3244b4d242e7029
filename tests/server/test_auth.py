"""Every route the extension registers is authenticated and its changes XSRF-protected.

The routes are read from the running server's router (not from a list kept by hand), so a handler
added later without ``@tornado.web.authenticated`` fails here.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any

import pytest
from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.httpclient import HTTPClientError
from tornado.routing import Router

from tgnb.server import handlers as tgnb_handlers

from .conftest import body

METHODS = ("get", "post", "put", "patch", "delete", "head")
#: The code object of the wrapper `tornado.web.authenticated` puts around every method it guards.
AUTHENTICATED = web.authenticated(lambda self: None).__code__  # type: ignore[arg-type]


def registered(app: web.Application) -> list[tuple[str, type]]:
    """(path pattern, handler class) of every rule on the server, walked recursively."""
    found: list[tuple[str, type]] = []

    def walk(router: Any) -> None:
        for rule in getattr(router, "rules", []):
            target = rule.target
            if isinstance(target, Router) or hasattr(target, "rules"):
                walk(target)
            elif isinstance(target, type) and issubclass(target, web.RequestHandler):
                regex = getattr(rule.matcher, "regex", None)
                found.append((regex.pattern if regex is not None else "", target))

    walk(app.wildcard_router)
    walk(app.default_router)
    return found


def tgnb_routes(app: web.Application) -> list[tuple[str, type]]:
    return [
        (pattern, cls)
        for pattern, cls in registered(app)
        if "/tgnb/" in urllib.parse.unquote(pattern) or cls.__module__.startswith("tgnb")
    ]


def own_methods(cls: type) -> list[str]:
    """The HTTP methods the class answers beyond what `APIHandler` itself defines."""
    return [m for m in METHODS if getattr(cls, m) is not getattr(APIHandler, m, None)]


async def test_every_route_is_registered_and_every_method_is_authenticated(jp_serverapp: Any):
    routes = tgnb_routes(jp_serverapp.web_app)
    classes = {cls for _, cls in routes}
    expected = {cls for _, cls in tgnb_handlers.routes()}
    assert classes == expected, "a route of the extension is missing or unexpected"
    assert len(routes) == len(tgnb_handlers.routes()) >= 8
    for pattern, cls in routes:
        assert issubclass(cls, APIHandler), f"{cls.__name__} does not check XSRF as APIHandler"
        methods = own_methods(cls)
        assert methods, f"{cls.__name__} at {pattern} answers no method"
        for name in methods:
            fn = getattr(cls, name)
            assert fn.__code__ is AUTHENTICATED, (
                f"{cls.__name__}.{name} ({pattern}) is not @tornado.web.authenticated"
            )


def concrete(pattern: str) -> str:
    return re.sub(r"\(\?P<\w+>[^)]*\)", "x", pattern).rstrip("$")


async def test_unauthenticated_requests_are_refused_on_every_route(
    jp_serverapp: Any, http_server_client: Any, emu: Any
):
    routes = tgnb_routes(jp_serverapp.web_app)
    checked = 0
    for pattern, cls in routes:
        url = concrete(pattern)
        for name in own_methods(cls):
            kw: dict[str, Any] = {"method": name.upper(), "follow_redirects": False}
            if name in ("post", "put", "patch"):
                kw["body"] = json.dumps({"preemptible": 8})
            with pytest.raises(HTTPClientError) as err:
                await http_server_client.fetch(url, raise_error=True, **kw)
            assert err.value.code in (302, 401, 403), (url, name, err.value.code)
            checked += 1
    assert checked >= 7
    # nothing was attached or scaled by the refused requests
    assert emu.requests() == []


async def test_cookie_authenticated_change_without_xsrf_token_is_refused(
    jp_serverapp: Any, http_server_client: Any, jp_base_url: str, emu: Any
):
    """A browser session (cookie) must send the XSRF token with a POST; a forged form cannot."""
    login = f"{jp_base_url}login"
    first = await http_server_client.fetch(login, raise_error=False)
    xsrf = first.headers.get_list("Set-Cookie")
    xsrf_value = next(c.split(";")[0].split("=", 1)[1] for c in xsrf if c.startswith("_xsrf="))
    form = urllib.parse.urlencode(
        {"password": jp_serverapp.identity_provider.token, "_xsrf": xsrf_value}
    )
    logged = await http_server_client.fetch(
        login,
        method="POST",
        body=form,
        headers={"Cookie": f"_xsrf={xsrf_value}"},
        follow_redirects=False,
        raise_error=False,
    )
    assert logged.code == 302, logged.code
    cookies = [c.split(";")[0] for c in logged.headers.get_list("Set-Cookie")]
    cookie = "; ".join([*cookies, f"_xsrf={xsrf_value}"])
    url = f"{jp_base_url}tgnb/scale"
    forged = await http_server_client.fetch(
        url, method="POST", body=json.dumps({}), headers={"Cookie": cookie}, raise_error=False
    )
    assert forged.code == 403
    # the same cookie with the token passes authentication and XSRF and reaches validation
    ok = await http_server_client.fetch(
        url,
        method="POST",
        body=json.dumps({}),
        headers={"Cookie": cookie, "X-XSRFToken": xsrf_value},
        raise_error=False,
    )
    assert ok.code == 400, ok.code
    assert "preemptible" in body(ok)["message"]
