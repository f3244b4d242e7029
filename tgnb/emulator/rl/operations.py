"""Training operations: idempotency, first-in-first-out per session, run on worker threads.

- ``submit(session, kind, key, work)``: the same ``Idempotency-Key`` for the same session and kind
  gives back the original operation (never a second application); no key, a new operation; the
  same key with another body is `KeyReused` (422: not retried by the SDK, unlike 409).
- Outputs are made JSON-safe (`json_safe`: a float that is not finite becomes null), so an
  operation that was applied is always answered and stored.
- Each session has one worker thread that runs its operations in the order they were submitted;
  the engine's own lock serialises sessions that share a resource (one GPU). Nothing runs on the
  HTTP event loop: handlers await an operation's completion through `wait`, with a bound.
- Failures carry a code: ``INVALID_INPUT`` (the engine's `RLInputError`, naming the field),
  ``NON_FINITE_LOSS``, ``SESSION_NOT_ACTIVE`` (the session stopped or expired before the operation
  ran) or ``INTERNAL_ERROR`` (a bug: the traceback goes to the emulator's log).
- Every operation is written to ``operations/<session>/<id>.json`` when submitted and when done;
  outputs of older finished operations are dropped from memory and read back on demand.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import math
import queue
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from tgnb.emulator.rl.state import (
    O_DONE,
    O_FAILED,
    O_PENDING,
    O_RUNNING,
    OP_ERROR,
    OperationRecord,
    RLStore,
    from_dict,
)

KINDS = (
    "forward-backward",
    "custom-forward-backward",
    "optim-step",
    "weights-sync",
    "sample",
    "training-checkpoint",
    "inference-checkpoint",
)
INVALID_INPUT = OP_ERROR + "INVALID_INPUT"
NON_FINITE_LOSS = OP_ERROR + "NON_FINITE_LOSS"
SESSION_NOT_ACTIVE = OP_ERROR + "SESSION_NOT_ACTIVE"
INTERNAL_ERROR = OP_ERROR + "INTERNAL_ERROR"
KEEP_OUTPUTS = 256  # finished operations whose output stays in memory


class OperationError(Exception):
    """A refusal with an operation error code (raised by the work itself or by the session)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def json_safe(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None (JSON has no NaN or
    Infinity: an output holding one could be neither answered nor stored)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def body_digest(body: Any) -> str:
    """A fingerprint of an operation's body (canonical JSON): a reused key must bring the same."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class KeyReused(Exception):
    """An Idempotency-Key already names an operation with another body (-> 422)."""

    def __init__(self, key: str, op_id: str) -> None:
        super().__init__(
            f"Idempotency-Key {key[:64]!r} was used for operation {op_id} with a different "
            "body; send a new key for a new request (a retry must resend the same body)"
        )


def classify(exc: BaseException) -> tuple[str, str]:
    """(error code, message) of an exception raised by an operation's work."""
    if isinstance(exc, OperationError):
        return exc.code, exc.message
    from tgnb.emulator.rl.engine import NonFiniteLoss, RLInputError
    from tgnb.emulator.rl.inputs import OperationCancelled

    if isinstance(exc, OperationCancelled):
        return SESSION_NOT_ACTIVE, str(exc)

    if isinstance(exc, RLInputError):
        field = getattr(exc, "field", "")
        message = str(exc)
        if field and field not in message:
            message = f"{field}: {message}"
        return INVALID_INPUT, message
    if isinstance(exc, NonFiniteLoss):
        return NON_FINITE_LOSS, str(exc) or "the loss is not finite"
    traceback.print_exception(exc)
    return INTERNAL_ERROR, f"internal error in the emulator: {type(exc).__name__}: {exc}"


class Operation:
    """One operation's record plus what waiters need (an event and done callbacks)."""

    def __init__(
        self, record: OperationRecord, evicted: bool = False, internal: bool = False
    ) -> None:
        self.record = record
        self.evicted = evicted  # output/error live on disk only
        self.internal = internal  # the emulator's own job (open, resume, close): not recorded
        self.done = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        if record.status in O_DONE:
            self.done.set()

    def add_callback(self, cb: Callable[[], None]) -> None:
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(cb)
                return
        cb()

    def finish(self) -> None:
        with self._lock:
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            with contextlib.suppress(RuntimeError):  # a waiter's event loop is gone
                cb()


Work = Callable[[], Any]
_STOP = object()


class _Worker:
    """One session's FIFO: a thread that runs its operations in submission order."""

    def __init__(self, session_id: str, run: Callable[[Operation, Work], None]) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()
        self._run = run
        self.thread = threading.Thread(
            target=self._loop, name=f"tgnb-rl-{session_id[:8]}", daemon=True
        )
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is _STOP:
                return
            op, work = item
            self._run(op, work)


class Operations:
    """All operations, their idempotency index and the per-session workers."""

    def __init__(self, store: RLStore, on_activity: Callable[[str], None]) -> None:
        self.store = store
        self.on_activity = on_activity  # session id: an operation started or finished
        self._ops: dict[str, Operation] = {}
        self._keys: dict[tuple[str, str, str], str] = {}
        self._workers: dict[str, _Worker] = {}
        self._recent: collections.deque[str] = collections.deque()
        self.running = 0  # operations computing now (the health route reports it)
        self._lock = threading.Lock()

    # ---- loading -----------------------------------------------------------------------------
    def restore(self, records: dict[str, OperationRecord], now: float) -> None:
        """Index operations read from disk; those cut short by a restart become FAILED."""
        for rec in records.values():
            if rec.status not in O_DONE:
                rec.status, rec.updated_at = O_FAILED, now
                rec.error = {
                    "code": INTERNAL_ERROR,
                    "message": "the emulator restarted before this operation finished; "
                    "check the session's step and submit it again",
                }
                self.store.save_operation(rec)
            rec.output = None  # read back from disk when asked for
            self._ops[rec.id] = Operation(rec, evicted=True)
            if rec.idempotency_key:
                self._keys[(rec.session_id, rec.kind, rec.idempotency_key)] = rec.id

    # ---- submitting and finding --------------------------------------------------------------
    def submit(
        self,
        session_id: str,
        kind: str,
        key: str | None,
        work: Work,
        now: float,
        *,
        inline: bool = False,
        digest: str | None = None,
    ) -> tuple[Operation, bool]:
        """Queue `work` on the session's FIFO; (operation, created). A known key: the original,
        or `KeyReused` when the original's body `digest` differs.

        `inline`: run `work` now in the caller (it only refuses: an ended session has no worker).
        """
        with self._lock:
            if key:
                known = self._keys.get((session_id, kind, key))
                if known is not None:
                    had = self._ops[known].record.body_digest
                    if digest and had and had != digest:
                        raise KeyReused(key, known)
                    return self._load(self._ops[known]), False
            rec = OperationRecord(
                id=str(uuid.uuid4()),
                session_id=session_id,
                kind=kind,
                created_at=now,
                updated_at=now,
                idempotency_key=key,
                body_digest=digest,
            )
            op = Operation(rec)
            self._ops[rec.id] = op
            if key:
                self._keys[(session_id, kind, key)] = rec.id
            self.store.save_operation(rec)
            if not inline:
                worker = self._workers.get(session_id)
                if worker is None:
                    worker = self._workers[session_id] = _Worker(session_id, self._execute)
                worker.queue.put((op, work))
        if inline:
            self._execute(op, work)
        return op, True

    def enqueue_internal(self, session_id: str, work: Work, now: float) -> Operation:
        """Queue the emulator's own job (open, resume, close) on the session's FIFO; not recorded."""
        rec = OperationRecord(
            id="internal", session_id=session_id, kind="internal", created_at=now, updated_at=now
        )
        op = Operation(rec, internal=True)
        with self._lock:
            worker = self._workers.get(session_id)
            if worker is None:
                worker = self._workers[session_id] = _Worker(session_id, self._execute)
            worker.queue.put((op, work))
        return op

    def find(self, session_id: str, kind: str, op_id: str) -> Operation | None:
        with self._lock:
            op = self._ops.get(op_id)
            if op is None or op.record.session_id != session_id or op.record.kind != kind:
                return None
            return self._load(op)

    def _load(self, op: Operation) -> Operation:
        if op.evicted:
            path = self.store.ops_dir / op.record.session_id / f"{op.record.id}.json"
            full = from_dict(OperationRecord, json.loads(path.read_text(encoding="utf-8")))
            return Operation(full)  # a detached copy: the in-memory index stays small
        return op

    def pending(self, session_id: str) -> int:
        with self._lock:
            return sum(
                1
                for op in self._ops.values()
                if op.record.session_id == session_id and not op.done.is_set()
            )

    def busy_sessions(self) -> set[str]:
        with self._lock:
            return {op.record.session_id for op in self._ops.values() if not op.done.is_set()}

    # ---- running -----------------------------------------------------------------------------
    def _execute(self, op: Operation, work: Work) -> None:
        rec = op.record
        rec.status, rec.updated_at = O_RUNNING, time.time()
        if not op.internal:
            self.on_activity(rec.session_id)
        with self._lock:
            self.running += 1
        try:
            output = work()
        except BaseException as exc:
            code, message = classify(exc)
            rec.error = {"code": code, "message": message}
            rec.status = O_FAILED
        else:
            rec.output = json_safe(output) if output is not None else {}
            rec.status = "TRAINING_OPERATION_STATUS_COMPLETED"
        finally:
            with self._lock:
                self.running -= 1
        rec.updated_at = time.time()
        if op.internal:
            op.finish()
            return
        self.store.save_operation(rec)
        self.on_activity(rec.session_id)
        op.finish()
        with self._lock:
            self._recent.append(rec.id)
            while len(self._recent) > KEEP_OUTPUTS:
                old = self._ops.get(self._recent.popleft())
                if old is not None and old.done.is_set():
                    old.record.output = None
                    old.evicted = True

    def close(self, session_id: str) -> None:
        """Stop the session's worker once what is queued has run (or failed)."""
        with self._lock:
            worker = self._workers.pop(session_id, None)
        if worker is not None:
            worker.queue.put(_STOP)

    def shutdown(self) -> None:
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            w.queue.put(_STOP)


async def wait(op: Operation, timeout: float) -> None:
    """Wait (without blocking the event loop) until `op` is done or `timeout` seconds pass."""
    if op.done.is_set() or timeout <= 0:
        return
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    def notify() -> None:
        loop.call_soon_threadsafe(wake)

    op.add_callback(notify)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(fut, timeout)


def is_pending(op: Operation) -> bool:
    return op.record.status in (O_PENDING, O_RUNNING)
