"""`PostTraining` (the service: models, resources, start, attach, download) and `Resource` (one
model resource: sessions, checkpoints, cost, events, panel, stop), over the SDK's
``together.post_training`` clients. Every input's type is checked before anything is sent
(`tgnb.posttraining.validate`); the service's own rules are the service's, and its refusals, as
all SDK failures, become `tgnb.errors` with the key scrubbed.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgnb import ptregistry
from tgnb.cloud.client import DEFAULT_BASE_URL
from tgnb.connection import Endpoint
from tgnb.errors import ApiError, NotFoundError, TgnbError, ValidationError
from tgnb.events import Event, utcnow
from tgnb.posttraining import validate as v
from tgnb.posttraining._connect import connect, download
from tgnb.posttraining.lifecycle import all_events
from tgnb.posttraining.records import (
    CheckpointInfo,
    Cost,
    ModelInfo,
    ResourceInfo,
    SessionInfo,
    as_time,
    split_by_sessions,
)
from tgnb.posttraining.session import TrainingSession

if TYPE_CHECKING:
    from together.post_training import ModelResourcesClient


class PostTraining:
    """The Post-Training API of one endpoint: ``tgnb.post_training()``. `seen_ready`: when this
    client's `start` saw each resource READY (the real API does not report it; the registry keeps
    the service's own time of it, `tgnb.ptregistry`)."""

    def __init__(self, conn: Endpoint) -> None:
        self.conn = conn
        self.seen_ready: dict[str, datetime] = {}

    def __repr__(self) -> str:
        return f"<PostTraining {self.conn.where.removeprefix('the ')} at {self.conn.base_url}>"

    @property
    def base_url(self) -> str:
        return self.conn.base_url or DEFAULT_BASE_URL

    def models(self) -> list[ModelInfo]:
        """The base models the service can host."""
        r = self.conn.call(
            lambda: self.conn.sdk().post_training.supported_models.get(), "list supported models"
        )
        return [ModelInfo.from_sdk(m) for m in (r.data or [])]

    def tokenizer(self, base_model: str | None = None) -> Any:
        """The Hugging Face tokenizer of `base_model` (default: the first supported model), by the
        name ``models()`` lists. On the local emulator it is read from the local Hugging Face cache
        without asking the Hub (``local_files_only``: no network, no retries, no environment
        variable; the emulator's built-in model is written there in the Hub's own layout), else
        from the Hub as ``AutoTokenizer.from_pretrained`` does."""
        from transformers import AutoTokenizer

        name = base_model if base_model is not None else self.models()[0].name
        if not isinstance(name, str) or not name.strip():
            raise ValidationError(
                f"base_model={name!r}: give a model name (pt.models() lists them)"
            )
        if self.conn.emulator is not None:
            try:
                return AutoTokenizer.from_pretrained(name, local_files_only=True)
            except OSError:
                pass  # not in the local cache (a hub id the emulator serves from elsewhere)
        return AutoTokenizer.from_pretrained(name)

    def resources(self, all: bool = False) -> list[ResourceInfo]:
        """This project's model resources (active ones unless `all`), newest first."""
        items: list[Any] = []
        after: str | None = None
        sdk = self.conn.sdk()
        for _ in range(20):
            kw: dict[str, Any] = {"limit": 100}
            if after:
                kw["after"] = after
            page: Any = self.conn.call(
                lambda kw=kw: sdk.post_training.model_resources.list(**kw),  # type: ignore[misc]
                "list model resources",
            )
            items += list(page.data or [])
            after = getattr(getattr(page, "meta", None), "next_cursor", None)
            if not after:
                break
        out = [ResourceInfo.from_sdk(r) for r in items]
        out.sort(key=lambda r: r.created_at or datetime.min.replace(tzinfo=timezone.utc))
        out.reverse()
        return out if all else [r for r in out if r.active]

    def start(
        self,
        base_model: str,
        generators: int = 1,
        inactive_timeout: int | None = None,
        lora: bool = True,
        ready_timeout: float | None = None,
    ) -> Resource:
        """Create a model resource for `base_model` and wait until it is READY.

        `generators`: generator replicas (0: a trainer-only resource, no sampling). `lora`: host up
        to 5 LoRA sessions (False: one full-weight session). `inactive_timeout`: seconds (300-86400)
        without operations before the service stops it (default
        `tgnb.ptregistry.DEFAULT_INACTIVE_TIMEOUT`, 900, or ``$TGNB_PT_INACTIVE_TIMEOUT``; the
        API's own is 3600). It is recorded in the tgnb home before the request is sent
        (`tgnb.ptregistry`): if this process dies, the next names it (`leftovers`).
        """
        v.check_base_model(base_model)
        n = v.check_generators(generators)
        timeout = v.check_inactive_timeout(inactive_timeout)
        if not isinstance(lora, bool):
            raise ValidationError(
                f"lora={lora!r} must be True (LoRA sessions) or False (full weight)"
            )
        client, _ = self.conn.call(
            lambda: ptregistry.create(
                self.conn,
                base_model=base_model,
                generators=n,
                by="tgnb.posttraining",
                lora=lora,
                inactive_timeout=timeout,
                ready_timeout=ready_timeout,
                interval=self.conn.poll,
            ),
            f"start a model resource for {base_model}",
        )
        self.seen_ready.setdefault(client.model_resources_id, utcnow())
        return Resource(self.conn, client, self.seen_ready)

    def attach(self, resource_id: str) -> Resource:
        """A handle on an existing model resource (nothing is provisioned)."""
        v.check_id(resource_id, "resource id", "pt.resources() lists them")
        from together.post_training import ModelResourcesClient

        client = self.conn.call(
            lambda: ModelResourcesClient.attach(
                model_resources_id=resource_id, **self.conn.native()
            ),
            f"attach model resource {resource_id}",
        )
        return Resource(self.conn, client, self.seen_ready)

    def track(self, client: Any) -> Any:
        """tgnb's view of a native SDK client, for recipes written against the SDK: a
        `ModelResourcesClient` becomes a `Resource` (panel, cost, events), a `SessionClient` a
        `TrainingSession` whose ``trainer``/``generator`` note losses and steps for the panel and
        whose ``record()`` adds rewards. Nothing is created; the client is shared, not copied."""
        from together.post_training import ModelResourcesClient, SessionClient

        if isinstance(client, ModelResourcesClient):
            return Resource(self.conn, client, self.seen_ready)
        if isinstance(client, SessionClient):
            s = self.conn.call(
                lambda: self.conn.sdk().post_training.sessions.retrieve(client.session_id),
                f"read session {client.session_id}",
            )
            return TrainingSession(self.conn, client, SessionInfo.from_sdk(s))
        raise ValidationError(
            f"track() takes a together.post_training ModelResourcesClient or SessionClient, "
            f"not {type(client).__name__}"
        )

    def checkpoints(self, session_id: str | None = None) -> list[CheckpointInfo]:
        """Checkpoints of this project (of one session with `session_id`), newest first."""
        kw: dict[str, Any] = {"limit": 100}
        if session_id is not None:
            kw["session_id"] = v.check_id(session_id, "session id", "res.sessions() lists them")
        page = self.conn.call(
            lambda: self.conn.sdk().post_training.checkpoints.list(**kw), "list checkpoints"
        )
        out = []
        for c in getattr(page, "data", None) or []:
            kind = "training" if str(c.type).endswith("TRAINING") else "inference"
            out.append(CheckpointInfo.from_sdk(c, kind, str(c.session_id)))
        return out

    def download(
        self, checkpoint_id: str, variant: str = "adapter", out: str | Path = "."
    ) -> list[Path]:
        """Download an inference checkpoint's files: ``"adapter"`` (LoRA weights, for peft) or
        ``"merged"`` (full weights) into the directory `out`."""
        v.check_id(checkpoint_id, "checkpoint id", "res.checkpoints() lists them")
        return download(self.conn, checkpoint_id, v.check_variant(variant), v.check_out_dir(out))

    def price(self, base_model: str, generators: int = 1, lora: bool = True) -> tuple[float, str]:
        """(price per hour, currency) of a resource, from the API's estimate-cost."""
        v.check_base_model(base_model)
        n = v.check_generators(generators)
        r = self.conn.call(
            lambda: self.conn.sdk().post_training.model_resources.estimate_cost(
                base_model=base_model,
                compute_config={"num_generator_replicas": n},
                lora_enabled=lora,
            ),
            f"estimate the cost of {base_model}",
        )
        return float(r.price_per_hour), str(r.currency)

    def leftovers(self) -> list[ptregistry.Leftover]:
        """Resources tgnb created here that are still active while the process that created
        them is gone, each with what it has cost (`tgnb.ptregistry.leftovers`)."""
        return self.conn.call(lambda: ptregistry.find(self.conn), "look for leftover resources")

    def stop_leftovers(self) -> list[tuple[str, str]]:
        """Stop every leftover (force: its sessions too): ``(resource id, status)`` each."""
        found = self.leftovers()
        return self.conn.call(
            lambda: ptregistry.stop_leftovers(self.conn, found), "stop leftover resources"
        )


class Resource:
    """One model resource: ``open_session()``, ``sessions()``, ``checkpoints()``, ``cost()``,
    ``events()``, ``panel()``, ``stop()``. ``client`` is the SDK's `ModelResourcesClient`."""

    def __init__(
        self, conn: Endpoint, client: ModelResourcesClient, seen_ready: dict[str, datetime]
    ) -> None:
        self.conn = conn
        self.seen_ready = seen_ready  # its PostTraining's
        self.client = client
        self.id = client.model_resources_id
        self._price: tuple[float, str] | None = None
        self._last: ResourceInfo | None = None

    def __repr__(self) -> str:
        """``<Resource 1945...: READY, Qwen/Qwen3-8B, LoRA>`` as last read (no request made)."""
        last = self._last
        if last is None:
            return f"<Resource {self.id}: status not read yet (.status reads it)>"
        kind = "LoRA" if last.lora_enabled else "full weight"
        return f"<Resource {self.id}: {last.status}, {last.base_model}, {kind}>"

    # -- state ---------------------------------------------------------------------------------
    def info(self) -> ResourceInfo:
        r = self.conn.call(
            lambda: self.conn.sdk().post_training.model_resources.retrieve(self.id),
            f"read model resource {self.id}",
        )
        self._last = ResourceInfo.from_sdk(r)
        return self._last

    @property
    def status(self) -> str:
        return self.info().status

    def sessions(self, active: bool = False) -> list[SessionInfo]:
        """This resource's training sessions, oldest first (only running ones with `active`)."""
        sdk = self.conn.sdk()
        page = self.conn.call(
            lambda: sdk.post_training.sessions.list(model_resources_id=self.id, limit=100),
            f"list the sessions of {self.id}",
        )
        out = [SessionInfo.from_sdk(s) for s in (page.data or [])]
        out = [s for s in out if s.resource_id in ("", self.id)]
        out.sort(key=lambda s: s.created_at or datetime.min.replace(tzinfo=timezone.utc))
        return [s for s in out if s.active] if active else out

    def open_session(
        self,
        lora: dict[str, Any] | None = None,
        name: str | None = None,
        resume_from: str | None = None,
        load_optimizer: bool | None = None,
    ) -> TrainingSession:
        """Open a training session: `lora` = ``{"rank": 8, "alpha": 16, ...}`` (LoRA resources),
        `name` a display name, `resume_from` a training checkpoint id to start from. The
        service's own rules (the model's rank range, the sessions a resource holds) are the
        service's: its refusal comes back as a `ValidationError` naming the fix (`_refusal`)."""
        config = v.check_lora(lora)
        v.check_name(name)
        if resume_from is not None:
            v.check_id(resume_from, "resume_from", "res.checkpoints() lists training checkpoints")
        if load_optimizer is not None and not isinstance(load_optimizer, bool):
            raise ValidationError(f"load_optimizer={load_optimizer!r} must be True or False")
        info = self.info()
        if not info.active:
            raise ValidationError(
                f"resource {self.id} is {info.status}: start a new one with pt.start(...)"
            )
        if config and not info.lora_enabled:
            raise ValidationError(
                f"resource {self.id} trains full weights: open its session without lora=, "
                "or start a LoRA resource (pt.start(..., lora=True))"
            )
        if name is not None and any(s.name == name for s in self.sessions(active=True)):
            raise ValidationError(f"a running session of {self.id} is already named {name!r}")
        try:
            client = self.conn.call(
                lambda: self.client.create_session(
                    display_name=name,
                    lora_config=config,  # type: ignore[arg-type]
                    resume_from_checkpoint_id=resume_from,
                    load_optimizer=load_optimizer,
                    interval=self.conn.poll,
                ),
                f"open a session on {self.id}",
            )
        except ApiError as exc:
            raise self._refusal(exc, config) from None
        sess = TrainingSession(self.conn, client, SessionInfo.from_sdk(client.retrieve()))
        return sess

    def _refusal(self, exc: ApiError, config: dict[str, Any] | None) -> TgnbError:
        """The service's refusal to open a session, as the fix: a rank out of the model's range
        (400 on ``lora_config.rank``: the range it names, if it names one) or a resource at its
        session cap (429, after the SDK's retries: the sessions that hold it, read now); any
        other refusal as it came."""
        said = str(exc)
        if exc.status_code == 400 and config and "rank" in config and "lora_config.rank" in said:
            top = re.search(r"\b1\s*(?:\.\.|to|-)\s*(\d+)", said.split("lora_config.rank", 1)[1])
            use = (
                f"1 to {top[1]} (this model's maximum)"
                if top
                else "a rank from 1 up to the model's maximum (pt.models() shows it)"
            )
            return ValidationError(
                f"LoRA rank {config['rank']} is out of range: use {use}, e.g. rank=8"
            )
        if exc.status_code == 429 and (active := self.sessions(active=True)):
            names = ", ".join(s.label for s in active)
            return ValidationError(
                f"resource {self.id} already holds {len(active)} session(s) ({names}), its limit: "
                "stop one first (sess.stop() or %tg pt stop --session ID)"
            )
        return exc

    def session(self, id_or_name: str) -> TrainingSession:
        """A handle on one of this resource's sessions, by id or display name."""
        v.check_id(id_or_name, "session", "res.sessions() lists them")
        found = [s for s in self.sessions() if id_or_name in (s.id, s.name)]
        running = [s for s in found if s.active] or found
        if not running:
            raise NotFoundError(
                f"no session {id_or_name!r} on resource {self.id}: res.sessions() lists them"
            )
        target = running[-1]
        from together.post_training import SessionClient

        client = self.conn.call(
            lambda: SessionClient.attach(session_id=target.id, **self.conn.native()),
            f"attach session {target.id}",
        )
        return TrainingSession(self.conn, client, target)

    def checkpoints(self) -> list[CheckpointInfo]:
        """Every checkpoint of this resource's sessions, oldest first."""
        out = [c for s in self.sessions() for c in s.checkpoints]
        out.sort(key=lambda c: (c.created_at is None, c.created_at))
        return out

    def extend(self, seconds: int) -> ResourceInfo:
        """Keep the resource from stopping for inactivity for `seconds` (60-86400) from now."""
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 60 <= seconds <= 86400:
            raise ValidationError(f"seconds={seconds!r} must be 60 to 86400, e.g. 3600")
        r = self.conn.call(
            lambda: self.client.extend_expiry(seconds=seconds), f"extend {self.id}'s expiry"
        )
        self._last = ResourceInfo.from_sdk(r)
        return self._last

    # -- cost and events -----------------------------------------------------------------------
    def usage(self) -> dict[str, Any] | None:
        """The local emulator's usage report (READY/STOPPED times, GPUs, GPU-minutes); None on
        the real service, which does not report it."""
        emulator = self.conn.emulator
        return None if emulator is None else emulator.usage(self.id)

    def price(self) -> tuple[float, str]:
        if self._price is None:
            info = self._last or self.info()
            self._price = PostTraining(self.conn).price(
                info.base_model, info.generators, info.lora_enabled
            )
        return self._price

    def cost(self) -> Cost:
        """GPU-minutes from READY to STOPPED (or now) and their price (the API's estimate-cost)."""
        info = self.info()
        price, currency = self.price()
        usage = self.usage() or {}
        ready = as_time(usage.get("ready_at"))
        estimated = ready is None
        if ready is None:  # the service's READY time, as its creator read it; else created_at
            ready = self._ready_seen() or info.created_at
        stopped = as_time(usage.get("stopped_at"))
        if stopped is None and not info.active:
            stopped = info.updated_at
        gpus = int(usage.get("gpus") or 0) or 1 + info.generators
        if ready is None:
            minutes = 0.0
        elif isinstance(usage.get("gpu_minutes"), (int, float)) and gpus:
            minutes = float(usage["gpu_minutes"]) / gpus
        else:
            end = stopped or utcnow()
            minutes = max((end - ready).total_seconds(), 0.0) / 60.0
        platform = usage.get("clock") == "platform"
        scale = usage.get("time_scale")
        cost = Cost(
            self.id,
            minutes,
            gpus,
            price,
            currency,
            ready,
            stopped,
            estimated,
            clock="platform" if platform else "wall",
            time_scale=float(scale) if platform and isinstance(scale, (int, float)) else None,
        )
        # the dollars of each session: the resource's, split by the time each was open
        return replace(cost, sessions=split_by_sessions(cost.amount, self.sessions(), utcnow()))

    def events(self) -> list[Event]:
        """The resource's and its sessions' lifecycle events (created, queued, ready, session
        started/stopped/expired/error, checkpoints), for ``tgnb.timeline``."""
        info = self.info()
        return all_events(info, self.sessions(), self.usage(), self._ready_seen())

    def _ready_seen(self) -> datetime | None:
        """The service's READY time as the process that created it read it (the registry), else
        when this process's `start` returned; None if neither knows."""
        entry = ptregistry.Registry(self.conn.home).find(self.id)
        return as_time(entry.ready_at if entry else None) or self.seen_ready.get(self.id)

    # -- lifecycle -----------------------------------------------------------------------------
    def stop(self, force: bool = False) -> ResourceInfo:
        """Stop the resource (billing stops). Refused while sessions are active unless `force`
        (which stops them too)."""
        if not isinstance(force, bool):
            raise ValidationError(f"force={force!r} must be True or False")
        try:
            self.conn.call(lambda: self.client.stop(force=force), f"stop {self.id}")
            ptregistry.Registry(self.conn.home).forget_resource(self.id)
        except ApiError as e:
            if e.status_code == 400 and not force:
                active = [s.label for s in self.sessions(active=True)]
                if active:
                    raise ApiError(
                        f"resource {self.id} still has {len(active)} active session(s) "
                        f"({', '.join(active)}): stop them first, or res.stop(force=True)",
                        status_code=400,
                    ) from None
            raise
        return self.info()

    def detach(self) -> None:
        """Release this handle; the resource keeps running (and billing) on the service."""
        self.client.detach()

    def wait(self, status: str, timeout: float = 60.0, interval: float = 0.5) -> ResourceInfo:
        """Poll until the resource's status is `status` (e.g. ``"STOPPED"``)."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if info.status == status:
                return info
            if time.monotonic() > deadline:
                raise ApiError(
                    f"resource {self.id} is {info.status}, not {status}, after {timeout}s"
                )
            time.sleep(interval)


def post_training(
    local: bool | None = None, *, home: str | Path | None = None, time_scale: float | None = None
) -> PostTraining:
    """The Post-Training API, where `tgnb.attach` goes by the same default: with no
    ``TOGETHER_API_KEY`` set, or ``local=True``, the local emulator of the tgnb home (started, or
    the running one reused) with the SDK pointed at it; with a key, or ``local=False``, Together,
    through ``TOGETHER_API_KEY`` and ``TOGETHER_BASE_URL`` as the SDK reads them."""
    return PostTraining(connect(local, home=home, time_scale=time_scale))


__all__ = ["PostTraining", "Resource", "download", "post_training"]
