"""A fake Kubernetes API server on 127.0.0.1, and builders for the JSON it answers with.

No Kubernetes API server can run on these machines (no kube-apiserver, kind, k3s or Docker engine
can be had here), so the tests that submit runs fake the API server at the HTTP boundary: the real
``kubernetes`` client sends real HTTP requests to this server, which records them and answers with
minimal valid JSON. Everything above the socket is the real client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

GOLDEN = Path(__file__).parent / "golden"
NS = "research"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


#: An answer: (status, JSON-able body) or (status, bytes) for a raw (log) body.
Answer = tuple[int, Any]


@dataclass
class FakeApiServer:
    """Records every request; answers from `routes` (method, path) -> answer or callable."""

    requests: list[Request] = field(default_factory=list)
    routes: dict[tuple[str, str], Any] = field(default_factory=dict)
    url: str = ""

    def route(self, method: str, path: str, answer: Answer | Callable[[Request], Answer]) -> None:
        self.routes[(method, path)] = answer

    def answer(self, req: Request) -> Answer:
        handler = self.routes.get((req.method, req.path))
        if handler is not None:
            return handler(req) if callable(handler) else handler
        if req.method == "POST" and isinstance(req.body, dict):
            created = json.loads(json.dumps(req.body))
            created.setdefault("metadata", {}).update(uid="u-1", resourceVersion="1")
            return 201, created
        if req.method == "DELETE" and "/services/" in req.path:  # the API answers with the object
            name = req.path.rsplit("/", 1)[-1]
            return 200, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}}
        if req.method == "DELETE":
            return 200, status_body(200, "Success", "deleted")
        return 404, status_body(404, "NotFound", f"{req.path} not found")

    def sent(self, method: str | None = None) -> list[Request]:
        return [r for r in self.requests if method is None or r.method == method]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _handler(server: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output quiet
            pass

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError:
                body = raw.decode("utf-8", "replace")
            req = Request(
                self.command,
                parts.path,
                parse_qs(parts.query),
                {k.lower(): v for k, v in self.headers.items()},
                body,
            )
            server.requests.append(req)
            code, payload = server.answer(req)
            if isinstance(payload, bytes):  # a log: streamed to EOF like the kubelet does
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Connection", "close")
                self.end_headers()
                for line in payload.splitlines(keepends=True):
                    self.wfile.write(line)
                    self.wfile.flush()
                self.close_connection = True
                return
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve

    return Handler


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
def api_client(fake_api: FakeApiServer) -> Iterator[Any]:
    """A real `kubernetes.client.ApiClient` with a dedicated Configuration aimed at `fake_api`."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = fake_api.url
    configuration.api_key = {"authorization": "test-token-not-secret"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    api = client.ApiClient(configuration)
    try:
        yield api
    finally:
        api.close()


# -- JSON the fake server answers with --------------------------------------------------------


def job_json(
    name: str, completions: int = 1, conditions: list[dict[str, Any]] | None = None, **meta: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, **meta},
        "spec": {
            "completions": completions,
            "parallelism": completions,
            "completionMode": "Indexed",
            "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
        },
        "status": {"conditions": conditions or []},
    }


def condition(type_: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": message}


def pod_json(
    name: str,
    *,
    run: str,
    index: int = 0,
    phase: str = "Running",
    node: str | None = "gpu-preemptible-dp-1",
    created: str = "2026-11-29T19:00:00Z",
    exit_code: int | None = None,
    failures: int = 0,
    ignored: int = 0,
    waiting: tuple[str, str] | None = None,
    unschedulable: str | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    if failures:
        annotations["batch.kubernetes.io/job-index-failure-count"] = str(failures)
    if ignored:
        annotations["batch.kubernetes.io/job-index-ignored-failure-count"] = str(ignored)
    if exit_code is not None:
        state: dict[str, Any] = {"terminated": {"exitCode": exit_code, "reason": "Error"}}
    elif waiting is not None:
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}}
    elif phase == "Running":
        state = {"running": {"startedAt": created}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    statuses = [
        {
            "name": "trainer",
            "image": "img",
            "imageID": "",
            "ready": phase == "Running",
            "restartCount": 0,
            "state": state,
        }
    ]
    conditions = []
    if unschedulable:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        )
        statuses = []
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "creationTimestamp": created,
        "labels": {"tgnb/run": run},
        "annotations": annotations,
    }
    if terminating:
        meta["deletionTimestamp"] = created
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "image": "img"}]}
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase, "containerStatuses": statuses, "conditions": conditions},
    }


def pod_list(*pods: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": list(pods)}


@dataclass(frozen=True)
class Json:
    """The builders above, handed to tests as a fixture (importlib mode cannot import conftest)."""

    ns: str = NS
    job: Callable[..., dict[str, Any]] = job_json
    pod: Callable[..., dict[str, Any]] = pod_json
    pods: Callable[..., dict[str, Any]] = pod_list
    condition: Callable[..., dict[str, Any]] = condition
    status: Callable[..., dict[str, Any]] = status_body
    golden: Path = GOLDEN


@pytest.fixture
def k8s() -> Json:
    return Json()
