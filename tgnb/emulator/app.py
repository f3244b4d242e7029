"""The emulated clusters API: a Starlette app served by uvicorn on 127.0.0.1.

Together-compatible routes (``Authorization: Bearer <key>`` required, 401 otherwise):
``GET/POST /v1/compute/clusters`` (``?projectId=`` filters the list),
``GET/PUT/DELETE /v1/compute/clusters/{cluster_id}``, ``GET /v1/compute/regions``,
``GET /v3/whoami``, ``GET /v1/projects``. Errors answer ``{"code", "message", "details"}``
(gRPC-gateway style): 400 bad input, 401 missing or wrong key, 404 unknown cluster or path, 413 a
body over `MAX_BODY` bytes. The key is checked before the body is read; a body must be JSON without
NaN or Infinity, nested at most `MAX_DEPTH` deep; every field is typed and bounded
(`tgnb.emulator.validation`) before anything is stored.

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
(``{"gpus": int | null, "cluster_id": optional}``), ``GET/POST/DELETE capacity/trace`` (a
capacity trace, `tgnb.emulator.trace`: started when posted; GET answers ``{"trace": ... | null}``
with its segments and ``now_s``, in platform seconds), ``GET/DELETE requests`` (the request log: every
/v1 and /v3 request with method, path, query, status, JSON body with secret-looking keys masked, and
the chaos applied; a body that is not JSON is kept cut to 200 characters with ``word=value``
secrets and the key masked; kept in memory, the last 10 000, gone after a restart).

Chaos: a seeded fraction of ``/v1`` requests is answered with 429 or 503 (with a short
``retry-after-ms``), or held for ``delay_s`` (default 65 s, past the SDK's 60 s timeout) before being
served normally. The same seed and the same sequence of requests give the same answers.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import random
import threading
import time
import traceback
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
    MAX_GPUS,
    NOT_FOUND,
    UNAUTHENTICATED,
    RequestError,
    finite_number,
    integer,
    optional_name,
    require_object,
    validate_create,
    validate_update,
)
from tgnb.emulator.wire import MAX_BODY, parse_json, scrub_body, scrub_text
from tgnb.events import format_time, parse_time

CHAOS_KINDS = ("429", "503", "delay")
#: Opt-in kinds (never drawn unless named): "lost" applies the request, then answers 503, as a
#: response lost on the way back would (retries must then be de-duplicated: Idempotency-Key).
EXTRA_CHAOS_KINDS = ("lost",)
_SECRET_WORDS = ("key", "token", "secret", "password", "authorization", "credential")
MAX_LOG = 10_000
#: Longest chaos delay (seconds): past the SDK's 60 s timeout, short of holding a request forever.
MAX_DELAY_S = 600.0


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
        from tgnb.emulator.volumes import Volumes

        regions = tuple(r["name"] for r in regions_to_api()["regions"])
        self.volumes = Volumes(
            fleet.store.root / "volumes.json", fleet.config.default_project_id, regions
        )

    def authorized(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)

    def log_request(self, request: Request, status: int, body: Any, chaos: str | None) -> None:
        if isinstance(body, str):
            body = scrub_text(body, self._key.decode())
        entry = {
            "time": format_time(parse_time(time.time())),
            "method": request.method,
            "path": request.url.path[:500],
            "query": scrub_text(str(request.url.query), self._key.decode())[:500],
            "status": status,
            "body": scrub_body(body),
            "chaos": chaos,
        }
        with self._log_lock:
            self.requests.append(entry)
            del self.requests[:-MAX_LOG]

    async def read_body(self, request: Request) -> bytes:
        """The body, at most `MAX_BODY` bytes (a 413 beyond, without reading the rest)."""
        length = request.headers.get("content-length")
        too_big = RequestError(
            413, INVALID_ARGUMENT, f"request body is larger than {MAX_BODY} bytes"
        )
        if length is not None:
            if not length.isdigit():
                raise RequestError(400, INVALID_ARGUMENT, "bad Content-Length header")
            if int(length) > MAX_BODY:
                raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def _unauthorized(self) -> RequestError:
        return RequestError(
            401,
            UNAUTHENTICATED,
            "invalid or missing API key: send 'Authorization: Bearer <key>' with the "
            "emulator's key (tgnb emulator status shows where it is)",
        )

    def api(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a /v1 or /v3 handler: check the key, read and parse the body (bounded), apply
        chaos, log."""

        async def endpoint(request: Request) -> Response:
            body: Any = None
            response: Response
            chaos: str | None = None
            try:
                if not self.authorized(request):
                    raise self._unauthorized()  # before the body is read
                raw = await self.read_body(request)
                if raw:
                    try:
                        body = parse_json(raw)
                    except RequestError:
                        body = raw[:1024].decode("utf-8", "replace")  # logged masked, cut
                        raise
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
            except Exception:  # a bug: say so in the log, answer without internals
                traceback.print_exc()
                response = _error(500, 13, "internal error in the emulator (see its log)")
            self.log_request(request, response.status_code, body, chaos)
            return response

        return endpoint

    def admin(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                if not self.authorized(request):
                    raise RequestError(401, UNAUTHENTICATED, "invalid or missing API key")
                raw = await self.read_body(request)
                body = require_object(parse_json(raw)) if raw else {}
                return JSONResponse(await handler(request, body))
            except RequestError as e:
                return JSONResponse(e.body(), e.status)
            except Exception:
                traceback.print_exc()
                return _error(500, 13, "internal error in the emulator (see its log)")

        return endpoint

    # ---- /v1 and /v3 -------------------------------------------------------------------------
    async def list_clusters(self, request: Request, body: Any) -> Any:
        project = request.query_params.get("projectId") or None
        return await asyncio.to_thread(self.fleet.list_clusters, project)

    async def create_cluster(self, request: Request, body: Any) -> Any:
        checked = validate_create(require_object(body))
        project = checked.get("project_id") or self.fleet.config.default_project_id
        volume = self.volumes.for_cluster(checked, project)  # 400 for an unknown volume_id
        made = None
        sv = checked.get("shared_volume")
        if volume is None and isinstance(sv, dict) and sv.get("volume_name"):
            made = self.volumes.create(
                {
                    "volume_name": sv["volume_name"],
                    "size_tib": int(sv.get("size_tib") or 1),
                    "region": sv.get("region") or checked["region"],
                    "project_id": project,
                }
            )
            volume = self.volumes.to_api(made)
        if volume is not None:
            checked = {**checked, "volume": volume}
        try:
            # node building runs off the event loop: health and reads answer meanwhile
            out = await asyncio.to_thread(self.fleet.create, checked)
        except BaseException:
            if made is not None:
                self.volumes.delete(made["volume_id"])
            raise
        if volume is not None:
            self.volumes.bind(volume["volume_id"], out["cluster_id"], attached_only=made is None)
        return out

    async def retrieve_cluster(self, request: Request, body: Any) -> Any:
        return self.fleet.retrieve(request.path_params["cluster_id"])

    async def update_cluster(self, request: Request, body: Any) -> Any:
        cluster_id = request.path_params["cluster_id"]
        checked = validate_update(require_object(body if body is not None else {}))
        return await asyncio.to_thread(self.fleet.update, cluster_id, checked)

    async def delete_cluster(self, request: Request, body: Any) -> Any:
        out = self.fleet.delete(request.path_params["cluster_id"])
        self.volumes.release(request.path_params["cluster_id"])
        return out

    # ---- shared volumes (tgnb.emulator.volumes) ----------------------------------------------
    async def create_volume(self, request: Request, body: Any) -> Any:
        return self.volumes.to_api(self.volumes.create(require_object(body)))

    async def list_volumes(self, request: Request, body: Any) -> Any:
        return self.volumes.list(request.query_params.get("project_id"))

    async def retrieve_volume(self, request: Request, body: Any) -> Any:
        return self.volumes.retrieve(request.path_params["volume_id"])

    async def update_volume(self, request: Request, body: Any) -> Any:
        return self.volumes.update(require_object(body))

    async def delete_volume(self, request: Request, body: Any) -> Any:
        return self.volumes.delete(request.path_params["volume_id"])

    async def regions(self, request: Request, body: Any) -> Any:
        return regions_to_api()

    async def whoami(self, request: Request, body: Any) -> Any:
        return whoami_to_api(self.fleet.config.default_project_id)

    async def projects(self, request: Request, body: Any) -> Any:
        return {"data": [project_to_api(p) for p in self.fleet.project_ids()], "next_cursor": None}

    async def not_found(self, request: Request, body: Any) -> Any:
        raise RequestError(404, NOT_FOUND, f"no route {request.method} {request.url.path[:200]}")

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
            "capacity_trace": self.fleet.capacity_trace() is not None,
            "state_dir": str(self.fleet.store.root),
            "clusters": len(self.fleet.clusters),
            "rl_resources": 0 if self.rl is None else len(self.rl.resources),
            "rl_operations_running": 0 if self.rl is None else self.rl.ops.running,
            "chaos": self.chaos.to_dict(),
            # state files kept aside at start (unreadable; renamed *.corrupt-<time>)
            "state_problems": self.fleet.store.problems
            + ([] if self.rl is None else self.rl.store.problems),
        }

    async def nodes(self, request: Request, body: Any) -> Any:
        return {"nodes": self.fleet.nodes(request.path_params["cluster_id"])}

    async def preempt(self, request: Request, body: Any) -> Any:
        node = optional_name(body.get("node"), "node")
        return self.fleet.preempt(request.path_params["cluster_id"], node)

    async def release(self, request: Request, body: Any) -> Any:
        p = request.path_params
        return self.fleet.release(p["cluster_id"], p["node"])

    async def chaos_get(self, request: Request, body: Any) -> Any:
        return self.chaos.to_dict()

    async def chaos_set(self, request: Request, body: Any) -> Any:
        unknown = sorted(set(body) - {"fraction", "seed", "kinds", "delay_s", "retry_after_ms"})
        if unknown:
            raise RequestError(400, INVALID_ARGUMENT, f"unknown chaos fields {unknown[:5]}")
        fraction = finite_number(body.get("fraction", 0.0), "fraction", 0.0, 1.0)
        raw_kinds = body.get("kinds") or list(CHAOS_KINDS)
        if not isinstance(raw_kinds, list) or not all(isinstance(k, str) for k in raw_kinds):
            raise RequestError(400, INVALID_ARGUMENT, f"kinds must be a list of {CHAOS_KINDS}")
        known = CHAOS_KINDS + EXTRA_CHAOS_KINDS
        bad = [k[:20] for k in raw_kinds if k not in known]
        if bad:
            raise RequestError(
                400, INVALID_ARGUMENT, f"unknown chaos kinds {bad[:5]}; known: {known}"
            )
        self.chaos = Chaos(
            fraction=fraction,
            seed=integer(body.get("seed", 0), "seed", 0, 2**63 - 1),
            kinds=tuple(raw_kinds),
            delay_s=finite_number(
                body.get("delay_s", self.chaos.delay_s), "delay_s", 0.0, MAX_DELAY_S
            ),
            retry_after_ms=integer(
                body.get("retry_after_ms", self.chaos.retry_after_ms), "retry_after_ms", 0, 60_000
            ),
        )
        return self.chaos.to_dict()

    async def capacity(self, request: Request, body: Any) -> Any:
        unknown = sorted(set(body) - {"gpus", "cluster_id"})
        if unknown:
            raise RequestError(400, INVALID_ARGUMENT, f"unknown capacity fields {unknown[:5]}")
        gpus = body.get("gpus")
        if gpus is not None:
            gpus = integer(gpus, "gpus (or null)", 0, 100 * MAX_GPUS)
        return self.fleet.set_capacity(gpus, optional_name(body.get("cluster_id"), "cluster_id"))

    async def trace_get(self, request: Request, body: Any) -> Any:
        return {"trace": self.fleet.capacity_trace()}

    async def trace_set(self, request: Request, body: Any) -> Any:
        return {"trace": self.fleet.set_capacity_trace(body)}

    async def trace_clear(self, request: Request, body: Any) -> Any:
        return {"trace": self.fleet.set_capacity_trace(None)}

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
        v = c + "/storage/volumes"
        routes = [
            Route(v, api(self.list_volumes), methods=["GET"]),
            Route(v, api(self.create_volume), methods=["POST"]),
            Route(v, api(self.update_volume), methods=["PUT"]),
            Route(v + "/{volume_id}", api(self.retrieve_volume), methods=["GET"]),
            Route(v + "/{volume_id}", api(self.delete_volume), methods=["DELETE"]),
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
            Route("/_emulator/capacity/trace", admin(self.trace_get), methods=["GET"]),
            Route("/_emulator/capacity/trace", admin(self.trace_set), methods=["POST"]),
            Route("/_emulator/capacity/trace", admin(self.trace_clear), methods=["DELETE"]),
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
