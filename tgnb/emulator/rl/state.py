"""Post-Training records (resources, sessions, checkpoints, operations) and their files.

Layout under ``<state_dir>/rl/``:

- ``records.json``: every model resource, training session and checkpoint (written atomically;
  one that cannot be read is renamed ``records.json.corrupt-<UTC time>`` and reported, and
  Post-Training starts empty while the clusters API serves on);
- ``operations/<session_id>/<operation_id>.json``: one file per operation (its idempotency key,
  status, output or error), rewritten on each transition;
- ``checkpoints/<checkpoint_id>/``: the engine's checkpoint files (safetensors + JSON, no pickle);
- ``exports/<checkpoint_id>/<variant>/``: downloadable files, made on the first download request;
- ``payloads/<payload_id>.json``: large operation bodies uploaded through the upload-url route.

Timestamps are POSIX seconds in the records and RFC 3339 on the wire. Records are plain
dataclasses; unknown keys in a record file are ignored, so older files still load.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from tgnb.atomic import atomic_write
from tgnb.emulator.store import atomic_write_json, keep_aside
from tgnb.events import format_time, parse_time

R_PENDING = "MODEL_RESOURCES_STATUS_PENDING"
R_CREATING = "MODEL_RESOURCES_STATUS_CREATING"
R_READY = "MODEL_RESOURCES_STATUS_READY"
R_STOPPING = "MODEL_RESOURCES_STATUS_STOPPING"
R_STOPPED = "MODEL_RESOURCES_STATUS_STOPPED"
R_ERROR = "MODEL_RESOURCES_STATUS_ERROR"
R_HOLDS_GPUS = (R_CREATING, R_READY, R_STOPPING)

S_CREATING = "TRAINING_SESSION_STATUS_CREATING"
S_RUNNING = "TRAINING_SESSION_STATUS_RUNNING"
S_STOPPING = "TRAINING_SESSION_STATUS_STOPPING"
S_STOPPED = "TRAINING_SESSION_STATUS_STOPPED"
S_ERROR = "TRAINING_SESSION_STATUS_ERROR"
S_EXPIRED = "TRAINING_SESSION_STATUS_EXPIRED"
S_ACTIVE = (S_CREATING, S_RUNNING, S_STOPPING)

O_PENDING = "TRAINING_OPERATION_STATUS_PENDING"
O_RUNNING = "TRAINING_OPERATION_STATUS_RUNNING"
O_COMPLETED = "TRAINING_OPERATION_STATUS_COMPLETED"
O_FAILED = "TRAINING_OPERATION_STATUS_FAILED"
O_DONE = (O_COMPLETED, O_FAILED)

OP_ERROR = "TRAINING_OPERATION_ERROR_CODE_"
SESSION_FAILED = "TRAINING_SESSION_ERROR_CODE_SESSION_FAILED"
CKPT_TRAINING = "CHECKPOINT_TYPE_TRAINING"
CKPT_INFERENCE = "CHECKPOINT_TYPE_INFERENCE"


def ts(t: float | None) -> str | None:
    return None if t is None else format_time(parse_time(t))


@dataclass
class ResourceRecord:
    id: str
    project_id: str
    base_model: str
    lora_enabled: bool
    num_generator_replicas: int
    gpu_type: str
    optimizer_config: dict[str, Any]
    inactive_timeout: int
    created_at: float
    updated_at: float
    status: str = R_PENDING
    gpus: int = 1
    creating_at: float | None = None  # when GPUs were granted (CREATING)
    ready_due: float | None = None  # when the scaled provisioning delay ends
    ready_at: float | None = None  # READY: GPU-minutes count from here ...
    stopped_at: float | None = None  # ... to here
    last_activity: float | None = None
    extended_until: float | None = None
    error: dict[str, Any] | None = None
    base_weights_ref: str | None = None
    # GPU time across daemon restarts: platform seconds READY in earlier lives of the daemon, and
    # the real time (and time scale) the current life's count starts from (None: ready_at, now's)
    billed_s: float = 0.0
    billing_since: float | None = None
    billing_scale: float | None = None
    unbilled_downtime_s: float = 0.0  # real seconds the daemon was down while it held GPUs
    idempotency_key: str | None = None  # the create's Idempotency-Key: same key, same resource


@dataclass
class SessionRecord:
    id: str
    project_id: str
    resource_id: str
    base_model: str
    created_at: float
    updated_at: float
    status: str = S_CREATING
    display_name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    lora_config: dict[str, Any] | None = None
    resume_from_checkpoint_id: str | None = None
    load_optimizer: bool = False
    step: int = 0
    policy_state: dict[str, Any] = field(default_factory=dict)
    training_checkpoints: list[str] = field(default_factory=list)
    inference_checkpoints: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None


@dataclass
class CheckpointRecord:
    id: str
    project_id: str
    session_id: str
    resource_id: str
    base_model: str
    type: str
    step: int
    created_at: float
    lora_rank: int | None = None
    weights_version: int | None = None  # the policy version of the weights it holds


@dataclass
class OperationRecord:
    id: str
    session_id: str
    kind: str
    created_at: float
    updated_at: float
    status: str = O_PENDING
    idempotency_key: str | None = None
    body_digest: str | None = None  # sha256 of the body's canonical JSON (a reused key's check)
    output: Any = None
    error: dict[str, Any] | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.output is not None:
            out["output"] = self.output
        if self.error is not None:
            out["error"] = self.error
        return out


T = TypeVar("T")


def from_dict(cls: type[T], raw: dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in raw.items() if k in names})


def write_json_quick(path: Path, data: Any) -> None:
    """Atomic (temp + rename) but not fsynced: survives a killed daemon, not a power cut."""
    atomic_write(path, json.dumps(data, separators=(",", ":")))


class RLStore:
    """The files of the Post-Training side under ``<state_dir>/rl``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.records_file = self.root / "records.json"
        self.ops_dir = self.root / "operations"
        self.checkpoints_dir = self.root / "checkpoints"
        self.exports_dir = self.root / "exports"
        self.payloads_dir = self.root / "payloads"
        self.problems: list[str] = []  # files kept aside at load (health reports them)
        #: touched every `HEARTBEAT_S` while the daemon runs: after a crash, when it stopped
        self.heartbeat_file = self.root / "heartbeat"

    def beat(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.heartbeat_file.touch()

    def last_alive(self) -> float | None:
        """When the previous daemon was last seen running (None: no trace of one)."""
        for path in (self.heartbeat_file, self.records_file):
            with contextlib.suppress(OSError):
                return path.stat().st_mtime
        return None

    def load(
        self,
    ) -> tuple[
        dict[str, ResourceRecord],
        dict[str, SessionRecord],
        dict[str, CheckpointRecord],
        dict[str, OperationRecord],
    ]:
        try:
            res, ses, cks = self._records()
        except FileNotFoundError:
            res, ses, cks = {}, {}, {}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # torn or hand-edited: kept aside (never overwritten), reported; the rest starts
            err = keep_aside(self.records_file, f"{type(exc).__name__}: {exc}")
            self.problems.append(str(err))
            print(f"tgnb emulator: {err}; Post-Training starts empty", file=sys.stderr, flush=True)
            res, ses, cks = {}, {}, {}
        ops: dict[str, OperationRecord] = {}
        if self.ops_dir.is_dir():
            for path in self.ops_dir.glob("*/*.json"):
                try:
                    op = from_dict(OperationRecord, json.loads(path.read_text(encoding="utf-8")))
                except (ValueError, TypeError):
                    continue  # a torn file cannot happen (rename), but never refuse to start
                ops[op.id] = op
        return res, ses, cks, ops

    def _records(
        self,
    ) -> tuple[dict[str, ResourceRecord], dict[str, SessionRecord], dict[str, CheckpointRecord]]:
        data = json.loads(self.records_file.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        res = {r["id"]: from_dict(ResourceRecord, r) for r in data.get("resources", [])}
        ses = {s["id"]: from_dict(SessionRecord, s) for s in data.get("sessions", [])}
        cks = {c["id"]: from_dict(CheckpointRecord, c) for c in data.get("checkpoints", [])}
        return res, ses, cks

    def save(
        self,
        resources: dict[str, ResourceRecord],
        sessions: dict[str, SessionRecord],
        checkpoints: dict[str, CheckpointRecord],
        *,
        durable: bool = True,
    ) -> None:
        data = {
            "version": 1,
            "resources": [asdict(r) for r in resources.values()],
            "sessions": [asdict(s) for s in sessions.values()],
            "checkpoints": [asdict(c) for c in checkpoints.values()],
        }
        if durable:
            atomic_write_json(self.records_file, data)
        else:
            write_json_quick(self.records_file, data)

    def save_operation(self, op: OperationRecord) -> None:
        write_json_quick(self.ops_dir / op.session_id / f"{op.id}.json", asdict(op))

    def checkpoint_dir(self, checkpoint_id: str) -> Path:
        return self.checkpoints_dir / checkpoint_id

    def export_dir(self, checkpoint_id: str, variant: str) -> Path:
        return self.exports_dir / checkpoint_id / variant

    def payload_path(self, payload_id: str) -> Path:
        return self.payloads_dir / f"{payload_id}.json"


class NonFiniteJSON(ValueError):
    """A JSON document holds NaN, Infinity or a number too large for a float."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path}: NaN and infinite numbers are not valid JSON; send finite values "
            "(to mask a position give it a zero weight rather than -inf)"
        )
        self.path = path


class _NonFinite:
    pass


_BAD = _NonFinite()


def _parse_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _BAD


def _find_bad(value: Any, path: str) -> str | None:
    if value is _BAD:
        return path or "body"
    if isinstance(value, dict):
        for k, v in value.items():
            found = _find_bad(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, (int, float, str)) and v is not _BAD:
                continue
            found = _find_bad(v, f"{path}[{i}]")
            if found:
                return found
    return None


def strict_json(raw: bytes | str) -> Any:
    """Parse JSON refusing NaN/Infinity (Python's json accepts them); NonFiniteJSON names where."""
    seen: list[bool] = []

    def bad(_: str) -> Any:
        seen.append(True)
        return _BAD

    def flt(text: str) -> Any:
        value = _parse_float(text)
        if value is _BAD:
            seen.append(True)
        return value

    value = json.loads(raw, parse_constant=bad, parse_float=flt)
    if seen:
        raise NonFiniteJSON(_find_bad(value, "") or "body")
    return value
