"""Sessions' work: creating them (capacity, resume), operations on the engine, payloads, exports.

Operation bodies arrive already parsed (NaN/Infinity refused); a ``payload_id`` merges the uploaded
body over the inline one (``{**inline, **payload}``) on the worker thread. The engine validates
the merged body and raises `RLInputError` (-> FAILED ``INVALID_INPUT``) before changing anything.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import Any

from tgnb.emulator.rl import checks
from tgnb.emulator.rl.lifecycle import RESOURCE_EXHAUSTED, Platform
from tgnb.emulator.rl.operations import (
    INVALID_INPUT,
    SESSION_NOT_ACTIVE,
    KeyReused,
    Operation,
    OperationError,
    body_digest,
)
from tgnb.emulator.rl.state import (
    CKPT_INFERENCE,
    CKPT_TRAINING,
    R_READY,
    S_ACTIVE,
    S_CREATING,
    S_RUNNING,
    CheckpointRecord,
    NonFiniteJSON,
    SessionRecord,
    strict_json,
    ts,
)
from tgnb.emulator.validation import INVALID_ARGUMENT, NOT_FOUND, RequestError
from tgnb.emulator.wire import MAX_DEPTH, depth_ok

VARIANTS = ("CHECKPOINT_VARIANT_MERGED", "CHECKPOINT_VARIANT_ADAPTER")


class AtCapacity(RequestError):
    """429 with ``retry-after-ms``: the resource holds its maximum of sessions."""

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(429, RESOURCE_EXHAUSTED, message)
        self.retry_after_ms = retry_after_ms


def create_session(p: Platform, body: Any) -> tuple[SessionRecord, Operation]:
    """Check, record and queue the opening of a session; (record, its opening job)."""
    from tgnb.emulator.rl.catalog import resolve, same_model

    c = checks.session_create(body)
    with p.lock:
        r = p.resource(c["model_resources_id"])
        if r.status != R_READY:
            raise checks.bad(
                "model_resources_id", f"model resource {r.id} is {r.status}; it must be READY"
            )
        resume = None
        if c["resume_from_checkpoint_id"]:
            resume = p.checkpoints.get(c["resume_from_checkpoint_id"])
            if resume is None or resume.project_id != p.config.project_id:
                raise checks.bad(
                    "resume_from_checkpoint_id",
                    f"checkpoint {c['resume_from_checkpoint_id']!r} not found in this project",
                )
            if resume.type != CKPT_TRAINING:
                raise checks.bad("resume_from_checkpoint_id", "must be a TRAINING checkpoint")
            if not same_model(resume.base_model, r.base_model, p.config.extra_models):
                raise checks.bad(
                    "resume_from_checkpoint_id",
                    f"checkpoint was trained from {resume.base_model}, the resource serves "
                    f"{r.base_model}",
                )
    lora = None
    if r.lora_enabled:
        from tgnb.emulator.rl.inputs import RLInputError, lora_config

        spec = resolve(r.base_model, p.config.extra_models)
        try:  # the engine's own check and defaults
            lora = lora_config(c["lora_config"], spec.max_lora_rank)
        except RLInputError as e:
            raise checks.bad(e.field, e.message) from None
    elif c["lora_config"] is not None:
        raise checks.bad(
            "lora_config", f"model resource {r.id} is full-weight (lora_enabled=false)"
        )
    note = ""
    if resume is not None and r.lora_enabled:
        lora, note = resumed_lora(p, resume, c["lora_config"])
    with p.lock:
        cap = p.config.max_lora_sessions if r.lora_enabled else 1
        active = p.active_sessions(r.id)
        if len(active) >= cap:
            raise AtCapacity(
                f"model resource {r.id} already holds {len(active)} active session(s), its "
                f"maximum ({cap}); stop one, or retry later",
                p.config.retry_after_ms,
            )
        now = p.clock()
        s = SessionRecord(
            id=str(uuid.uuid4()),
            project_id=p.config.project_id,
            resource_id=r.id,
            base_model=r.base_model,
            created_at=now,
            updated_at=now,
            status=S_CREATING,
            display_name=c["display_name"],
            metadata={**c["metadata"], **({RESUME_NOTE: note} if note else {})},
            lora_config=lora,
            resume_from_checkpoint_id=c["resume_from_checkpoint_id"],
            load_optimizer=c["load_optimizer"],
        )
        p.sessions[s.id] = s
        r.last_activity = now
        p.save()
        return s, p.open_session(s, resume, "")


#: The session metadata key that says once how a resume's LoRA config differed from the asked one.
RESUME_NOTE = "resume_lora_config"


def resumed_lora(p: Platform, resume: CheckpointRecord, asked: Any) -> tuple[dict[str, Any], str]:
    """The LoRA config a session resuming from `resume` trains with: the checkpoint's (its adapter
    shapes are fixed), and a note naming what of `asked` differed ("" when nothing did; a seed
    never counts: the weights are the checkpoint's). A checkpoint that cannot be read is a 400."""
    from tgnb.emulator.rl.checkpoints import read_meta
    from tgnb.emulator.rl.inputs import RLInputError

    try:
        meta = read_meta(p.store.checkpoint_dir(resume.id))
    except RLInputError as e:
        raise checks.bad("resume_from_checkpoint_id", e.message) from None
    saved = meta.get("lora_config")
    if not isinstance(saved, dict):
        raise checks.bad(
            "resume_from_checkpoint_id", f"checkpoint {resume.id} holds no LoRA adapter"
        )
    given = {k: v for k, v in (asked or {}).items() if v is not None and k != "seed"}
    diff = [f"{k} {given[k]!r}" for k in sorted(given) if k in saved and given[k] != saved[k]]
    if not diff:
        return dict(saved), ""
    kept = ", ".join(f"{k} {saved[k]!r}" for k in ("rank", "alpha", "dropout", "train_unembed"))
    return dict(saved), (
        f"lora_config {', '.join(diff)} was not used: a session resuming from checkpoint "
        f"{resume.id} trains with that checkpoint's LoRA config ({kept})"
    )


def submit(p: Platform, sid: str, kind: str, key: str | None, body: Any) -> tuple[Operation, bool]:
    """Queue one operation on the session's FIFO (the original one for a known key)."""
    body = checks.require_object(body)
    digest = body_digest(body) if key else None  # outside the lock: bodies reach 1 MiB
    with p.lock:
        s = p.session(sid)
        ended = s.status not in S_ACTIVE
        try:
            return p.ops.submit(
                sid, kind, key, lambda: _run(p, s, kind, body), p.clock(), inline=ended,
                digest=digest,
            )  # fmt: skip
        except KeyReused as e:
            raise RequestError(422, INVALID_ARGUMENT, str(e)) from None


def _run(p: Platform, s: SessionRecord, kind: str, body: dict[str, Any]) -> Any:
    if s.status != S_RUNNING:
        raise OperationError(
            SESSION_NOT_ACTIVE, f"training session {s.id} is {s.status}; start a new session"
        )
    host = p.host_for(s.resource_id)
    r = p.resources[s.resource_id]
    body = _merge_payload(p, s, body)
    if kind == "forward-backward":
        out = host.forward_backward(s.id, body)
    elif kind == "custom-forward-backward":
        out = host.custom_forward_backward(s.id, body)
    elif kind == "optim-step":
        out = host.optim_step(s.id, body)
    elif kind == "weights-sync":
        out = host.weights_sync(s.id, body)
    elif kind == "sample":
        if r.num_generator_replicas == 0:
            raise OperationError(
                INVALID_INPUT,
                "sample: the model resource has no generator (num_generator_replicas=0)",
            )
        out = host.sample(s.id, body)
    else:
        out = _checkpoint(
            p, host, s, CKPT_TRAINING if kind == "training-checkpoint" else CKPT_INFERENCE
        )
    with p.lock:
        s.step = int(host.step(s.id))
        s.policy_state = dict(host.policy_state(s.id))
        s.updated_at = p.clock()
        p.dirty = True  # written by the next tick (a restart resumes from checkpoints anyway)
    return out


def _checkpoint(p: Platform, host: Any, s: SessionRecord, kind: str) -> dict[str, Any]:
    cid = str(uuid.uuid4())
    target = p.store.checkpoint_dir(cid)
    tmp = target.with_name(f".{cid}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    if kind == CKPT_TRAINING:
        host.save_training_checkpoint(s.id, tmp)
    else:
        host.save_inference_checkpoint(s.id, tmp)
    tmp.rename(target)
    now = p.clock()
    # both kinds hold the trainer's weights at its step (policy version = step), not the ones
    # last published for sampling
    step = version = int(host.step(s.id))
    rec = CheckpointRecord(
        id=cid,
        project_id=s.project_id,
        session_id=s.id,
        resource_id=s.resource_id,
        base_model=s.base_model,
        type=kind,
        step=step,
        created_at=now,
        lora_rank=(s.lora_config or {}).get("rank"),
        weights_version=version,
    )
    with p.lock:
        p.checkpoints[cid] = rec
        (s.training_checkpoints if kind == CKPT_TRAINING else s.inference_checkpoints).append(cid)
        p.save()
    return {
        "checkpoint": {
            "id": cid,
            "created_at": ts(now),
            "step": str(rec.step),
            "weights_version": str(version),
        }
    }


# ---- payloads -------------------------------------------------------------------------------
def payload_path(p: Platform, sid: str, payload_id: str) -> Path:
    return p.store.payloads_dir / sid / f"{payload_id}.json"


def _merge_payload(p: Platform, s: SessionRecord, body: dict[str, Any]) -> dict[str, Any]:
    pid = body.get("payload_id")
    if pid is None:
        return body
    path = payload_path(p, s.id, str(pid)) if isinstance(pid, str) and pid.isalnum() else None
    if path is None or not path.is_file():
        raise OperationError(
            INVALID_INPUT,
            f"payload_id: payload {pid!r} was not uploaded for this session "
            "(PUT the body to the upload_url of payloads/upload-url first)",
        )
    try:
        payload = strict_json(path.read_bytes())
    except NonFiniteJSON as e:
        raise OperationError(INVALID_INPUT, f"payload {e}") from None
    except (ValueError, RecursionError):
        raise OperationError(INVALID_INPUT, f"payload_id: payload {pid} is not JSON") from None
    if not depth_ok(payload, MAX_DEPTH):
        raise OperationError(
            INVALID_INPUT, f"payload_id: payload {pid} nests deeper than {MAX_DEPTH}"
        )
    if not isinstance(payload, dict):
        raise OperationError(INVALID_INPUT, f"payload_id: payload {pid} is not a JSON object")
    inline = {k: v for k, v in body.items() if k != "payload_id"}
    return {**inline, **payload}


# ---- checkpoint downloads -------------------------------------------------------------------
def checkpoint(p: Platform, cid: str) -> CheckpointRecord:
    c = p.checkpoints.get(cid)
    if c is None or c.project_id != p.config.project_id:
        raise RequestError(404, NOT_FOUND, f"checkpoint {cid!r} not found")
    return c


def export(p: Platform, c: CheckpointRecord, variant: str) -> list[Path]:
    """The files of one variant of a checkpoint (made once, on a thread; cached on disk)."""
    from tgnb.emulator.rl.engine import export_checkpoint

    out = p.store.export_dir(c.id, variant)
    done = out / ".files.json"
    if done.is_file():
        return [out / n for n in json.loads(done.read_text())]
    tmp = out.with_name(f".{variant}.{uuid.uuid4().hex}.tmp")
    tmp.mkdir(parents=True)
    try:
        files = export_checkpoint(p.store.checkpoint_dir(c.id), variant, tmp)
        names = [Path(f).name for f in files]
        (tmp / ".files.json").write_text(json.dumps(names))
        if out.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / n for n in names]
