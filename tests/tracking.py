"""Helpers of the tracker tests (`tgnb.train.tracker`): a real MLflow tracking server, and W&B's
offline files read back.

W&B's offline run (``WANDB_MODE=offline``) is a directory ``wandb/offline-run-<time>-<id>`` per
``wandb.init``, holding ``run-<id>.wandb``: W&B's transaction log (a 7-byte header, then 32 KiB
blocks of records, each a 7-byte header -- CRC, length, type -- and a piece of a protobuf
``Record``), which ``wandb sync`` uploads. `wandb_runs` reads it with wandb's own protobuf classes;
the framing is read here (wandb ships no reader in Python)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

_BLOCK, _HEADER = 32 * 1024, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B transaction log"
    pos, piece = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # the block's tail: padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding of the last block
            pos += left
            continue
        body = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == _FULL:
            yield body
        elif kind == _FIRST:
            piece = body
        elif kind == _MIDDLE:
            piece += body
        elif kind == _LAST:
            yield piece + body


@dataclass
class WandbRun:
    """One offline ``wandb.init``: the run id, and its history rows (key -> value)."""

    path: Path
    run_id: str = ""
    project: str = ""
    resumed: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None


def wandb_runs(wandb_dir: Path) -> list[WandbRun]:
    """Every offline run under `wandb_dir` (``$WANDB_DIR``), oldest first, read from its files."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for run_dir in sorted((wandb_dir / "wandb").glob("offline-run-*")):
        (log,) = run_dir.glob("run-*.wandb")
        run = WandbRun(run_dir)
        for raw in _records(log):
            rec = pb.Record()
            rec.ParseFromString(raw)
            which = rec.WhichOneof("record_type")
            if which == "run":
                run.run_id, run.project = rec.run.run_id, rec.run.project
                run.resumed = run.resumed or bool(rec.run.resumed)
            elif which == "history":
                row = {}
                for item in rec.history.item:
                    key = item.key or "/".join(item.nested_key)
                    row[key] = json.loads(item.value_json)
                run.history.append(row)
            elif which == "exit":
                run.exit_code = rec.exit.exit_code
        out.append(run)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real MLflow tracking server (``mlflow server``, SQLite store, artifacts served) on a free
    local port: its URL."""
    import httpx

    port = _free_port()
    root = tmp_path / "mlflow"
    root.mkdir()
    log = open(root / "server.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root}/mlflow.db",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # gunicorn's workers linger: the server is done with
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
