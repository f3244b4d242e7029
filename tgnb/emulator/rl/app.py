"""The ``/v1/rl/...`` routes of the emulator (Post-Training), behind the clusters API's key check,
chaos knob and request log (`tgnb.emulator.app.EmulatorApp`).

The key is checked before the body is read; bodies are capped at `tgnb.emulator.wire.MAX_BODY`
(413 beyond; larger payloads go through an upload URL, capped at `MAX_PAYLOAD`) and parsed refusing
NaN/Infinity (400 naming the field) and nesting deeper than `MAX_DEPTH`. Slow work never runs on the event
loop: the engine runs on each session's worker thread, model loads and exports on threads, and
handlers await them with a bound, so a quick operation finishes inside its POST and a GET
long-polls (`POST_WAIT_S`, `GET_WAIT_S`); the first GET after a create answers READY when the
(scaled) provisioning delay is short. An operation that fails ``INVALID_INPUT`` while its POST waits
is answered 400 (message naming the field); a GET shows it FAILED. An Idempotency-Key reused with
another body is a 422. A bug in a route is still a one-line JSON 500, in the request log (its
traceback in the emulator's log); operation outputs are JSON-safe (`operations.json_safe`).

Unauthenticated, unguessable URLs (the SDK sends no Authorization there): ``PUT /rl-blobs/{token}``
(payload uploads) and ``GET /rl-files/{token}/{filename}`` (checkpoint downloads).

Admin (same key, no chaos, not logged): ``GET /_emulator/rl/resources/{id}/usage`` (GPU-seconds,
GPU-minutes, cost, price), ``GET /_emulator/rl/resources/{id}/memory`` (the engine's bytes),
``POST /_emulator/rl/resources/{id}/expire`` (make it idle-expired now, as if the timeout passed).
"""

from __future__ import annotations

import asyncio
import secrets
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from tgnb.atomic import atomic_write
from tgnb.emulator.rl import checks, operations, training, views
from tgnb.emulator.rl.lifecycle import Platform
from tgnb.emulator.rl.operations import INVALID_INPUT, KINDS
from tgnb.emulator.rl.state import (
    CKPT_INFERENCE,
    O_FAILED,
    R_CREATING,
    NonFiniteJSON,
    strict_json,
)
from tgnb.emulator.validation import INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, RequestError
from tgnb.emulator.wire import MAX_DEPTH, depth_ok

if TYPE_CHECKING:
    from tgnb.emulator.app import EmulatorApp

POST_WAIT_S = 20.0
GET_WAIT_S = 20.0
LOG_LIST_ITEMS = 8


def summarize(value: Any) -> Any:
    """A body for the request log: lists cut to a few items (operation bodies can be large)."""
    if isinstance(value, dict):
        return {k: summarize(v) for k, v in value.items()}
    if isinstance(value, list):
        head = [summarize(v) for v in value[:LOG_LIST_ITEMS]]
        if len(value) > LOG_LIST_ITEMS:
            head.append(f"... {len(value)} items")
        return head
    return value


def _status(r: Request) -> list[str]:
    return [v for raw in r.query_params.getlist("status") for v in raw.split(",") if v]


#: The largest payload an upload URL takes (the SDK sends bodies over 0.5 MiB through them): the
#: work caps (`tgnb.emulator.rl.inputs`) fit in a few MiB of JSON.
MAX_PAYLOAD = 16 << 20
INTERNAL = 13


class RLApi:
    """The Post-Training routes around one `Platform`."""

    def __init__(self, platform: Platform, emu: EmulatorApp) -> None:
        self.p = platform
        self.emu = emu
        self._blobs: dict[str, tuple[str, str]] = {}  # token -> (session id, payload id)
        self._files: dict[str, Path] = {}  # token -> export directory

    # ---- the wrapper -------------------------------------------------------------------------
    def api(self, handler: Any) -> Any:
        async def endpoint(request: Request) -> Response:
            body: Any = None
            chaos: str | None = None
            response: Response
            try:
                if not self.emu.authorized(request):  # before a byte of the body is read
                    raise RequestError(
                        401,
                        UNAUTHENTICATED,
                        "invalid or missing API key: send 'Authorization: Bearer <key>' with the "
                        "emulator's key (tgnb emulator status shows where it is)",
                    )
                raw = await self.emu.read_body(request)  # at most MAX_BODY: 413 beyond
                if raw.strip():
                    try:
                        body = strict_json(raw)
                    except NonFiniteJSON as e:
                        raise checks.bad(e.path, str(e).split(": ", 1)[1]) from None
                    except (ValueError, RecursionError):
                        raise RequestError(
                            400, INVALID_ARGUMENT, "body is not valid JSON"
                        ) from None
                    if not depth_ok(body, MAX_DEPTH):
                        raise RequestError(
                            400, INVALID_ARGUMENT, f"request body nests deeper than {MAX_DEPTH}"
                        )
                chaos = self.emu.chaos.draw()
                if chaos in ("429", "503"):
                    response = JSONResponse(
                        RequestError(
                            int(chaos), 8 if chaos == "429" else 14, "emulator chaos"
                        ).body(),
                        int(chaos),
                    )
                    response.headers["retry-after-ms"] = str(self.emu.chaos.retry_after_ms)
                else:
                    if chaos == "delay":
                        await asyncio.sleep(self.emu.chaos.delay_s)
                    response = JSONResponse(await handler(request, body))
                    if chaos == "lost":  # applied, but the answer never arrives
                        response = JSONResponse(RequestError(503, 14, "emulator chaos").body(), 503)
                        response.headers["retry-after-ms"] = str(self.emu.chaos.retry_after_ms)
            except training.AtCapacity as e:
                response = JSONResponse(e.body(), e.status)
                response.headers["retry-after-ms"] = str(e.retry_after_ms)
            except RequestError as e:
                response = JSONResponse(e.body(), e.status)
            except ClientDisconnect:
                raise
            except Exception as e:  # a bug: still one JSON answer, in the request log too
                traceback.print_exception(e)
                err = RequestError(500, INTERNAL, f"internal error: {type(e).__name__}")
                response = JSONResponse(err.body(), 500)
            self.emu.log_request(request, response.status_code, summarize(body), chaos)
            return response

        return endpoint

    def admin(self, handler: Any) -> Any:
        return self.emu.admin(handler)

    # ---- models and resources ----------------------------------------------------------------
    async def supported_models(self, request: Request, body: Any) -> Any:
        from tgnb.emulator.rl.catalog import supported_models_to_api

        return await asyncio.to_thread(supported_models_to_api, self.p.config.extra_models)

    def _resource(self, rid: str) -> dict[str, Any]:
        with self.p.lock:
            r = self.p.resource(rid)
            return views.resource(r, self.p.queue_position(r), self.p.expires_at(r))

    async def create_resource(self, request: Request, body: Any) -> Any:
        checked = await asyncio.to_thread(checks.resource_create, body, self.p.config.extra_models)
        r = self.p.create_resource(checked, request.headers.get("idempotency-key") or None)
        return self._resource(r.id)

    async def get_resource(self, request: Request, body: Any) -> Any:
        rid = request.path_params["rid"]
        self.p.tick()
        if self.p.resource(rid).status == R_CREATING:
            await asyncio.to_thread(self.p.wait_ready, rid, GET_WAIT_S)
        return self._resource(rid)

    async def list_resources(self, request: Request, body: Any) -> Any:
        self.p.tick()
        wanted = _status(request)
        with self.p.lock:
            items = [
                r
                for r in sorted(self.p.resources.values(), key=lambda r: r.created_at)
                if r.project_id == self.p.config.project_id and (not wanted or r.status in wanted)
            ]
            return views.page(
                items,
                dict(request.query_params),
                lambda r: views.resource(r, self.p.queue_position(r), self.p.expires_at(r)),
            )

    async def stop_resource(self, request: Request, body: Any) -> Any:
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        r = self.p.stop_resource(request.path_params["rid"], force)
        return self._resource(r.id)

    async def extend_expiry(self, request: Request, body: Any) -> Any:
        b = checks.require_object(body)
        seconds = b.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 0 < seconds <= 86400:
            raise checks.bad("seconds", f"must be an integer in 1..86400, got {seconds!r}")
        r = self.p.extend_expiry(request.path_params["rid"], seconds)
        return self._resource(r.id)

    async def estimate_cost(self, request: Request, body: Any) -> Any:
        checked = await asyncio.to_thread(checks.resource_create, body, self.p.config.extra_models)
        price = checked["gpus"] * self.p.config.price_per_gpu_hour
        return {"currency": "USD", "price_per_hour": price}

    # ---- sessions ----------------------------------------------------------------------------
    def _session(self, sid: str) -> dict[str, Any]:
        with self.p.lock:
            return views.session(self.p.session(sid), self.p.checkpoints)

    async def create_session(self, request: Request, body: Any) -> Any:
        s, opening = await asyncio.to_thread(training.create_session, self.p, body)
        await operations.wait(opening, POST_WAIT_S)
        err = opening.record.error
        if opening.done.is_set() and err and err.get("code") == INVALID_INPUT:
            self.p.session_failed_to_open(s, err["message"], drop=True)
            raise RequestError(400, INVALID_ARGUMENT, err["message"])
        return self._session(s.id)

    async def get_session(self, request: Request, body: Any) -> Any:
        return self._session(request.path_params["sid"])

    async def update_session(self, request: Request, body: Any) -> Any:
        b = checks.require_object(body)
        if "display_name" in b and not isinstance(b["display_name"], str):
            raise checks.bad("display_name", "must be a string")
        name = checks.display_name(b.get("display_name"))
        with self.p.lock:
            s = self.p.session(request.path_params["sid"])
            if "display_name" in b:
                s.display_name = name or None
            if "metadata" in b:
                meta = checks.require_object(b["metadata"], "metadata")
                s.metadata = {k: v for k, v in {**s.metadata, **meta}.items() if v != ""}
            s.updated_at = self.p.clock()
            self.p.save()
        return self._session(s.id)

    async def list_sessions(self, request: Request, body: Any) -> Any:
        q = dict(request.query_params)
        wanted = _status(request)
        with self.p.lock:
            items = [
                s
                for s in sorted(self.p.sessions.values(), key=lambda s: s.created_at)
                if s.project_id == self.p.config.project_id
                and (not wanted or s.status in wanted)
                and q.get("model_resources_id") in (None, "", s.resource_id)
            ]
            return views.page(items, q, lambda s: views.session(s, self.p.checkpoints))

    async def stop_session(self, request: Request, body: Any) -> Any:
        s = self.p.stop_session(request.path_params["sid"])
        return self._session(s.id)

    # ---- operations --------------------------------------------------------------------------
    async def post_operation(self, request: Request, body: Any) -> Any:
        sid, kind = request.path_params["sid"], request.path_params["kind"]
        if kind not in KINDS:
            raise RequestError(404, NOT_FOUND, f"unknown operation kind {kind!r}")
        key = request.headers.get("idempotency-key") or None
        op, _created = training.submit(self.p, sid, kind, key, body)
        await operations.wait(op, POST_WAIT_S)
        rec = op.record
        if rec.status == O_FAILED and (rec.error or {}).get("code") == INVALID_INPUT:
            message = (rec.error or {}).get("message", "invalid input")
            raise RequestError(
                400, INVALID_ARGUMENT, message, [{"operation_id": rec.id, "detail": message}]
            )
        return rec.to_api()

    async def get_operation(self, request: Request, body: Any) -> Any:
        p = request.path_params
        self.p.session(p["sid"])
        op = self.p.ops.find(p["sid"], p["kind"], p["op_id"])
        if op is None:
            raise RequestError(404, NOT_FOUND, f"operation {p['op_id']!r} not found")
        await operations.wait(op, GET_WAIT_S)
        return op.record.to_api()

    # ---- payloads ----------------------------------------------------------------------------
    async def upload_url(self, request: Request, body: Any) -> Any:
        sid = request.path_params["sid"]
        self.p.session(sid)
        pid = secrets.token_hex(16)
        token = secrets.token_urlsafe(32)
        self._blobs[token] = (sid, pid)
        return {"payload_id": pid, "upload_url": f"{request.base_url}rl-blobs/{token}"}

    async def download_url(self, request: Request, body: Any) -> Any:
        raise RequestError(404, NOT_FOUND, "the emulator never offloads operation results")

    async def put_blob(self, request: Request) -> Response:
        found = self._blobs.get(request.path_params["token"])
        if found is None:
            return JSONResponse(RequestError(404, NOT_FOUND, "unknown upload URL").body(), 404)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_PAYLOAD:
                err = RequestError(
                    413, INVALID_ARGUMENT, f"payload larger than {MAX_PAYLOAD} bytes"
                )
                return JSONResponse(err.body(), 413)
            chunks.append(chunk)
        data = b"".join(chunks)
        path = training.payload_path(self.p, *found)

        await asyncio.to_thread(atomic_write, path, data)
        return Response(status_code=200)

    # ---- checkpoints -------------------------------------------------------------------------
    async def get_checkpoint(self, request: Request, body: Any) -> Any:
        return views.checkpoint(training.checkpoint(self.p, request.path_params["cid"]))

    async def list_checkpoints(self, request: Request, body: Any) -> Any:
        q = dict(request.query_params)
        with self.p.lock:
            items = [
                c
                for c in sorted(self.p.checkpoints.values(), key=lambda c: -c.created_at)
                if c.project_id == self.p.config.project_id
                and q.get("session_id") in (None, "", c.session_id)
                and q.get("base_model") in (None, "", c.base_model)
                and q.get("type") in (None, "", c.type)
            ]
        return views.page(items, q, views.checkpoint)

    async def download(self, request: Request, body: Any) -> Any:
        from tgnb.emulator.rl.engine import RLInputError

        c = training.checkpoint(self.p, request.path_params["cid"])
        if c.type != CKPT_INFERENCE:  # the SDK: "ID of the inference checkpoint to download"
            raise checks.bad(
                "checkpoint_id",
                f"checkpoint {c.id} is a TRAINING checkpoint (weights and optimizer state, to "
                "resume a session from); only inference checkpoints download: create one "
                "(create_inference_checkpoint) and download that",
            )
        variant = request.query_params.get("variant") or training.VARIANTS[0]
        if variant not in training.VARIANTS:
            raise checks.bad("variant", f"must be one of {list(training.VARIANTS)}")
        try:
            files = await asyncio.to_thread(training.export, self.p, c, variant)
        except RLInputError as e:
            raise checks.bad(getattr(e, "field", "variant"), str(e)) from None
        token = secrets.token_urlsafe(32)
        if files:
            self._files[token] = files[0].parent
        base = f"{request.base_url}rl-files/{token}/"
        return {
            "data": [
                {"filename": f.name, "size": str(f.stat().st_size), "url": base + f.name}
                for f in files
            ]
        }

    async def get_file(self, request: Request) -> Response:
        folder = self._files.get(request.path_params["token"])
        name = request.path_params["filename"]
        path = folder / name if folder is not None else None
        if path is None or "/" in name or name.startswith(".") or not path.is_file():
            return JSONResponse(RequestError(404, NOT_FOUND, "unknown file URL").body(), 404)
        return FileResponse(path)

    # ---- admin -------------------------------------------------------------------------------
    async def usage(self, request: Request, body: Any) -> Any:
        return self.p.usage(request.path_params["rid"])

    async def memory(self, request: Request, body: Any) -> Any:
        rid = request.path_params["rid"]
        self.p.resource(rid)
        host = self.p.hosts.get(rid)
        return {
            "model_resources_id": rid,
            "memory_bytes": None if host is None else await asyncio.to_thread(host.memory_bytes),
        }

    async def expire(self, request: Request, body: Any) -> Any:
        with self.p.lock:
            r = self.p.resource(request.path_params["rid"])
            r.extended_until = None
            r.last_activity = self.p.clock() - r.inactive_timeout - 1
        self.p.tick()
        return self._resource(r.id)

    def routes(self) -> list[Route]:
        api, admin = self.api, self.admin
        mr, ts_, op = "/v1/rl/model-resources", "/v1/rl/training-sessions", "/operations/{kind}"
        ck = "/v1/rl/checkpoints"
        return [
            Route("/v1/rl/supported-models", api(self.supported_models), methods=["GET"]),
            Route(mr, api(self.create_resource), methods=["POST"]),
            Route(mr, api(self.list_resources), methods=["GET"]),
            Route(mr + "/estimate-cost", api(self.estimate_cost), methods=["POST"]),
            Route(mr + "/{rid}", api(self.get_resource), methods=["GET"]),
            Route(mr + "/{rid}/stop", api(self.stop_resource), methods=["POST"]),
            Route(mr + "/{rid}/extend-expiry", api(self.extend_expiry), methods=["POST"]),
            Route(ts_, api(self.create_session), methods=["POST"]),
            Route(ts_, api(self.list_sessions), methods=["GET"]),
            Route(ts_ + "/{sid}", api(self.get_session), methods=["GET"]),
            Route(ts_ + "/{sid}", api(self.update_session), methods=["PATCH"]),
            Route(ts_ + "/{sid}/stop", api(self.stop_session), methods=["POST"]),
            Route(ts_ + "/{sid}" + op, api(self.post_operation), methods=["POST"]),
            Route(ts_ + "/{sid}" + op + "/{op_id}", api(self.get_operation), methods=["GET"]),
            Route(ts_ + "/{sid}/payloads/upload-url", api(self.upload_url), methods=["POST"]),
            Route(
                ts_ + "/{sid}/payloads/{pid}/download-url",
                api(self.download_url),
                methods=["POST"],
            ),
            Route(ck, api(self.list_checkpoints), methods=["GET"]),
            Route(ck + "/{cid}", api(self.get_checkpoint), methods=["GET"]),
            Route(ck + "/{cid}/download", api(self.download), methods=["GET"]),
            Route("/rl-blobs/{token}", self.put_blob, methods=["PUT"]),
            Route("/rl-files/{token}/{filename}", self.get_file, methods=["GET"]),
            Route("/_emulator/rl/resources/{rid}/usage", admin(self.usage), methods=["GET"]),
            Route("/_emulator/rl/resources/{rid}/memory", admin(self.memory), methods=["GET"]),
            Route("/_emulator/rl/resources/{rid}/expire", admin(self.expire), methods=["POST"]),
        ]
