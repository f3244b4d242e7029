"""The emulated clusters API: a Starlette app served by uvicorn on 127.0.0.1.

Together-compatible routes (``Authorization: Bearer <key>`` required, 401 otherwise):
``GET/POST /v1/compute/clusters`` (``?projectId=`` filters the list),
``GET/PUT/DELETE /v1/compute/clusters/{cluster_id}``, ``GET /v1/compute/regions``,
``GET /v3/whoami``, ``GET /v1/projects``. Errors answer ``{"code", "message", "details"}``
(gRPC-gateway style): 400 bad input, 401 missing or wrong key, 404 unknown cluster or path.

Post-Training (``/v1/rl/...``, unauthenticated ``/rl-blobs`` and ``/rl-files`` URLs, admin
``/_emulator/rl/...``): `tgnb.emulator.rl.app`, mounted when the daemon passes an `rl` platform;
``health`` then also reports ``rl_resources`` and ``rl_operations_running``.

Base URL: the SDK's paths already start with ``/v1`` (or ``/v3``), so point ``TOGETHER_BASE_URL`` (the
SDK's ``base_url`` and the ``tg`` CLI alike) at ``http://127.0.0.1:<port>`` with no ``/v1``. A base URL
that ends in ``/v1`` also works: the app drops a doubled leading ``/v1`` (``/v1/v1/...``, ``/v1/v3/...``).

Emulator-only admin routes under ``/_emulator/`` (same key; never subject to chaos, never logged):
``GET health``, ``GET clusters/{id}/nodes``, ``POST clusters/{id}/preempt`` (``{"node": name}``,
optional), ``POST clusters/{id}/nodes/{node}/release`` (end a drain window early),
``GET/POST chaos`` (``{"fraction", "seed", "kinds", "delay_s"}``; kinds 429, 503, delay, and the
opt-in "lost": applied, then answered 503), ``POST capacity``
(``{"gpus": int | null, "cluster_id": optional}``), ``GET/DELETE requests`` (the request log: every
/v1 and /v3 request with method, path, query, status, JSON body with secret-looking keys masked, and
the chaos applied; kept in memory, the last 10 000, gone after a restart).

Chaos: a seeded fraction of ``/v1`` requests is answered with 429 or 503 (with a short
``retry-after-ms``), or held for ``delay_s`` (default 65 s, past the SDK's 60 s timeout) before being
served normally. The same seed and the same sequence of requests give the same answers.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tgnb.emulator.fleet import Fleet
from tgnb.emulator.models import project_to_api, regions_to_api, whoami_to_api
from tgnb.emulator.validation import (
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNAUTHENTICATED,
    RequestError,
    require_object,
    validate_create,
    validate_update,
)
from tgnb.events import format_time, parse_time

CHAOS_KINDS = ("429", "503", "delay")
#: Opt-in kinds (never drawn unless named): "lost" applies the request, then answers 503, as a
#: response lost on the way back would (retries must then be de-duplicated: Idempotency-Key).
EXTRA_CHAOS_KINDS = ("lost",)
_SECRET_WORDS = ("key", "token", "secret", "password", "authorization", "credential")
MAX_LOG = 10_000


@dataclass
class Chaos:
    """The chaos knob: `fraction` of /v1 requests get one of `kinds`, drawn from `seed`."""

    fraction: float = 0.0
    seed: int = 0
    kinds: tuple[str, ...] = CHAOS_KINDS
    delay_s: float = 65.0
    retry_after_ms: int = 100
    rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def draw(self) -> str | None:
        if self.fraction <= 0 or not self.kinds:
            return None
        if self.rng.random() >= self.fraction:
            return None
        return self.kinds[self.rng.randrange(len(self.kinds))]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "seed": self.seed,
            "kinds": list(self.kinds),
            "delay_s": self.delay_s,
            "retry_after_ms": self.retry_after_ms,
        }


def _scrub_body(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("***" if any(w in str(k).lower() for w in _SECRET_WORDS) else _scrub_body(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_scrub_body(v) for v in value]
    return value


def _error(status: int, code: int, message: str) -> JSONResponse:
    return JSONResponse(RequestError(status, code, message).body(), status)


class _DoubledV1:
    """Accept a base URL that ends in /v1: ``/v1/v1/...`` and ``/v1/v3/...`` lose the first /v1."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path.startswith(("/v1/v1/", "/v1/v3/")):
                scope = dict(scope)
                scope["path"] = path[3:]
                scope["raw_path"] = scope["path"].encode()
        await self.app(scope, receive, send)


Handler = Callable[[Request, Any], Awaitable[Any]]


class EmulatorApp:
    """The routes, the key check, the chaos knob and the request log around one `Fleet`."""

    def __init__(
        self, fleet: Fleet, api_key: str, chaos: Chaos | None = None, rl: Any = None
    ) -> None:
        self.fleet = fleet
        self.rl = rl  # tgnb.emulator.rl.lifecycle.Platform: the /v1/rl routes (Post-Training)
        self._key = api_key.encode()
        self.chaos = chaos or Chaos()
        self.requests: list[dict[str, Any]] = []
        self._log_lock = threading.Lock()
        self.started_at = time.time()

    def _authorized(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)

    def _log(self, request: Request, status: int, body: Any, chaos: str | None) -> None:
        entry = {
            "time": format_time(parse_time(time.time())),
            "method": request.method,
            "path": request.url.path,
            "query": str(request.url.query),
            "status": status,
            "body": _scrub_body(body),
            "chaos": chaos,
        }
        with self._log_lock:
            self.requests.append(entry)
            del self.requests[:-MAX_LOG]

    def api(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a /v1 or /v3 handler: parse the body, check the key, apply chaos, log."""

        async def endpoint(request: Request) -> Response:
            raw = await request.body()
            body: Any = None
            response: Response
            chaos: str | None = None
            try:
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        body = raw.decode("utf-8", "replace")[:200]
                        raise RequestError(
                            400, INVALID_ARGUMENT, "request body is not valid JSON"
                        ) from None
                if not self._authorized(request):
                    raise RequestError(
                        401,
                        UNAUTHENTICATED,
                        "invalid or missing API key: send 'Authorization: Bearer <key>' with the "
                        "emulator's key (tgnb emulator status shows where it is)",
                    )
                if request.url.path.startswith("/v1/"):
                    chaos = self.chaos.draw()
                if chaos == "429":
                    response = _error(429, 8, "rate limit exceeded (emulator chaos)")
                    response.headers["retry-after-ms"] = str(self.chaos.retry_after_ms)
                elif chaos == "503":
                    response = _error(503, 14, "service unavailable (emulator chaos)")
                    response.headers["retry-after-ms"] = str(self.chaos.retry_after_ms)
                else:
                    if chaos == "delay":
                        await asyncio.sleep(self.chaos.delay_s)
                    result = await handler(request, body)
                    response = JSONResponse(result)
                    if chaos == "lost":
                        response = _error(503, 14, "service unavailable (emulator chaos)")
                        response.headers["retry-after-ms"] = str(self.chaos.retry_after_ms)
            except RequestError as e:
                response = JSONResponse(e.body(), e.status)
            self._log(request, response.status_code, body, chaos)
            return response

        return endpoint

    def admin(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if not self._authorized(request):
                    raise RequestError(401, UNAUTHENTICATED, "invalid or missing API key")
                raw = await request.body()
                body = json.loads(raw) if raw else {}
                return JSONResponse(await handler(request, body))
            except RequestError as e:
                return JSONResponse(e.body(), e.status)
            except (ValueError, TypeError, KeyError) as e:
                return _error(400, INVALID_ARGUMENT, f"bad admin request: {e}")

        return endpoint

    # ---- /v1 and /v3 -------------------------------------------------------------------------
    async def list_clusters(self, request: Request, body: Any) -> Any:
        return self.fleet.list_clusters(request.query_params.get("projectId") or None)

    async def create_cluster(self, request: Request, body: Any) -> Any:
        return self.fleet.create(validate_create(require_object(body)))

    async def retrieve_cluster(self, request: Request, body: Any) -> Any:
        return self.fleet.retrieve(request.path_params["cluster_id"])

    async def update_cluster(self, request: Request, body: Any) -> Any:
        cluster_id = request.path_params["cluster_id"]
        checked = validate_update(require_object(body if body is not None else {}))
        return self.fleet.update(cluster_id, checked)

    async def delete_cluster(self, request: Request, body: Any) -> Any:
        return self.fleet.delete(request.path_params["cluster_id"])

    async def regions(self, request: Request, body: Any) -> Any:
        return regions_to_api()

    async def whoami(self, request: Request, body: Any) -> Any:
        return whoami_to_api(self.fleet.config.default_project_id)

    async def projects(self, request: Request, body: Any) -> Any:
        return {"data": [project_to_api(p) for p in self.fleet.project_ids()], "next_cursor": None}

    async def not_found(self, request: Request, body: Any) -> Any:
        raise RequestError(404, NOT_FOUND, f"no route {request.method} {request.url.path}")

    # ---- /_emulator --------------------------------------------------------------------------
    async def health(self, request: Request, body: Any) -> Any:
        cfg = self.fleet.config
        return {
            "status": "ok",
            "pid": os.getpid(),
            "started_at": format_time(parse_time(self.started_at)),
            "time_scale": cfg.time_scale,
            "drain_window_s": cfg.drain_window_s,
            "provision_delay_s": cfg.provision_delay_s,
            "preemption_rate": cfg.preemption_rate,
            "capacity_gpus": cfg.capacity_gpus,
            "state_dir": str(self.fleet.store.root),
            "clusters": len(self.fleet.clusters),
            "rl_resources": 0 if self.rl is None else len(self.rl.resources),
            "rl_operations_running": 0 if self.rl is None else self.rl.ops.running,
            "chaos": self.chaos.to_dict(),
        }

    async def nodes(self, request: Request, body: Any) -> Any:
        return {"nodes": self.fleet.nodes(request.path_params["cluster_id"])}

    async def preempt(self, request: Request, body: Any) -> Any:
        node = (body or {}).get("node")
        return self.fleet.preempt(request.path_params["cluster_id"], node)

    async def release(self, request: Request, body: Any) -> Any:
        p = request.path_params
        return self.fleet.release(p["cluster_id"], p["node"])

    async def chaos_get(self, request: Request, body: Any) -> Any:
        return self.chaos.to_dict()

    async def chaos_set(self, request: Request, body: Any) -> Any:
        fraction = float(body.get("fraction", 0.0))
        if not 0.0 <= fraction <= 1.0:
            raise RequestError(400, INVALID_ARGUMENT, "fraction must be between 0 and 1")
        kinds = tuple(str(k) for k in body.get("kinds") or CHAOS_KINDS)
        known = CHAOS_KINDS + EXTRA_CHAOS_KINDS
        bad = [k for k in kinds if k not in known]
        if bad:
            raise RequestError(400, INVALID_ARGUMENT, f"unknown chaos kinds {bad}; known: {known}")
        self.chaos = Chaos(
            fraction=fraction,
            seed=int(body.get("seed", 0)),
            kinds=kinds,
            delay_s=float(body.get("delay_s", self.chaos.delay_s)),
            retry_after_ms=int(body.get("retry_after_ms", self.chaos.retry_after_ms)),
        )
        return self.chaos.to_dict()

    async def capacity(self, request: Request, body: Any) -> Any:
        gpus = body.get("gpus")
        if gpus is not None and (not isinstance(gpus, int) or gpus < 0):
            raise RequestError(400, INVALID_ARGUMENT, "gpus must be a non-negative integer or null")
        return self.fleet.set_capacity(gpus, body.get("cluster_id"))

    async def requests_get(self, request: Request, body: Any) -> Any:
        with self._log_lock:
            return {"requests": list(self.requests)}

    async def requests_clear(self, request: Request, body: Any) -> Any:
        with self._log_lock:
            n = len(self.requests)
            self.requests.clear()
        return {"cleared": n}

    def _rl_routes(self) -> list[Route]:
        if self.rl is None:
            return []
        from tgnb.emulator.rl.app import RLApi

        return RLApi(self.rl, self).routes()

    def build(self) -> ASGIApp:
        api, admin = self.api, self.admin
        c = "/v1/compute/clusters"
        routes = [
            Route(c, api(self.list_clusters), methods=["GET"]),
            Route(c, api(self.create_cluster), methods=["POST"]),
            Route(c + "/{cluster_id}", api(self.retrieve_cluster), methods=["GET"]),
            Route(c + "/{cluster_id}", api(self.update_cluster), methods=["PUT"]),
            Route(c + "/{cluster_id}", api(self.delete_cluster), methods=["DELETE"]),
            Route("/v1/compute/regions", api(self.regions), methods=["GET"]),
            Route("/v3/whoami", api(self.whoami), methods=["GET"]),
            Route("/v1/projects", api(self.projects), methods=["GET"]),
            Route("/_emulator/health", admin(self.health), methods=["GET"]),
            Route("/_emulator/clusters/{cluster_id}/nodes", admin(self.nodes), methods=["GET"]),
            Route(
                "/_emulator/clusters/{cluster_id}/preempt", admin(self.preempt), methods=["POST"]
            ),
            Route(
                "/_emulator/clusters/{cluster_id}/nodes/{node}/release",
                admin(self.release),
                methods=["POST"],
            ),
            Route("/_emulator/chaos", admin(self.chaos_get), methods=["GET"]),
            Route("/_emulator/chaos", admin(self.chaos_set), methods=["POST"]),
            Route("/_emulator/capacity", admin(self.capacity), methods=["POST"]),
            Route("/_emulator/requests", admin(self.requests_get), methods=["GET"]),
            Route("/_emulator/requests", admin(self.requests_clear), methods=["DELETE"]),
            *self._rl_routes(),
            Route(
                "/{path:path}",
                api(self.not_found),
                methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
            ),
        ]
        return _DoubledV1(Starlette(routes=routes))
