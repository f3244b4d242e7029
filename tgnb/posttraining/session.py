"""`TrainingSession`: one session of a model resource, over the SDK's `SessionClient`.

``sess.trainer`` and ``sess.generator`` are the SDK's own `Trainer` and `Generator` (subclasses that
change nothing but note what they did: each forward-backward's loss, each optim-step's step, each
weights-sync's policy version, and one record per operation), so a recipe uses the native API and
the panel still draws its curves. ``sess.record(reward_mean=...)`` adds the metrics only the loop
knows. Everything else (status, checkpoints, policy state) is read from the API.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgnb.posttraining import validate as v
from tgnb.posttraining.metrics import MetricLog, metrics_dir
from tgnb.posttraining.records import CheckpointInfo, SessionInfo

if TYPE_CHECKING:
    from together.post_training import Generator, SessionClient, Trainer

    from tgnb.connection import Endpoint


@functools.cache
def _classes() -> tuple[type, type]:
    """The recording Trainer and Generator subclasses (built on first use: the SDK is imported
    here, not by ``import tgnb``)."""
    from dataclasses import dataclass, field

    from together.post_training import Generator, Trainer

    @dataclass(frozen=True)
    class RecordingTrainer(Trainer):
        _log: MetricLog | None = field(default=None, compare=False, repr=False)

        async def forward_backward_async(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().forward_backward_async(*args, **kwargs)
            if self._log is not None:
                self._log.operation("forward-backward")
                loss = getattr(result, "loss", None)
                if isinstance(loss, (int, float)):
                    self._log.record(loss=float(loss))
            return result

        async def forward_async(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().forward_async(*args, **kwargs)
            if self._log is not None:
                self._log.operation("forward")
            return result

        async def custom_forward_backward_async(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().custom_forward_backward_async(*args, **kwargs)
            if self._log is not None:
                self._log.operation("custom-forward-backward")
            return result

        async def optim_step_async(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().optim_step_async(*args, **kwargs)
            if self._log is not None:
                self._log.operation("optim-step")
                step = getattr(result, "step", None)
                if step is not None:
                    self._log.set_step(int(step))
            return result

        async def weights_sync_async(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().weights_sync_async(*args, **kwargs)
            if self._log is not None:
                self._log.operation("weights-sync")
                version = getattr(result, "weights_version", None)
                if version is not None:
                    self._log.record(policy_version=float(int(version)))
            return result

    @dataclass(frozen=True)
    class RecordingGenerator(Generator):
        _log: MetricLog | None = field(default=None, compare=False, repr=False)

        async def sample_batch_async(self, *args: Any, **kwargs: Any) -> Any:
            result = await super().sample_batch_async(*args, **kwargs)
            if self._log is not None:
                self._log.operation("sample")
            return result

    return RecordingTrainer, RecordingGenerator


class TrainingSession:
    """A training session: ``trainer``, ``generator``, ``record()``, checkpoints, ``stop()``.

    Build it with `tgnb.posttraining.Resource.open_session` or ``Resource.session(id)``.
    """

    def __init__(self, conn: Endpoint, client: SessionClient, info: SessionInfo) -> None:
        self.conn = conn
        self.client = client
        self._info = info
        self.id = info.id
        self.name = info.name
        self.resource_id = info.resource_id
        self.log = MetricLog(metrics_dir(conn.home) / f"{info.id}.jsonl", step=info.step)
        self._trainer: Trainer | None = None
        self._generator: Generator | None = None

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"<TrainingSession {self.id}{label} on {self.resource_id}: {self._info.status}>"

    # -- the SDK's objects ---------------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The SDK's `Trainer` (forward, forward_backward, custom_forward_backward, optim_step,
        weights_sync); losses, steps and policy versions are noted for the panel."""
        if self._trainer is None:
            trainer_cls, _ = _classes()
            self._trainer = trainer_cls(self.client, self.log)
        return self._trainer

    @property
    def generator(self) -> Generator:
        """The SDK's `Generator` (sample, sample_batch, compute_logprobs)."""
        if self._generator is None:
            if not self.client.has_generator:
                from tgnb.errors import ValidationError

                raise ValidationError(
                    f"session {self.id} has no generator: its resource was started with "
                    "generators=0; start one with pt.start(..., generators=1)"
                )
            _, generator_cls = _classes()
            self._generator = generator_cls(self.client, self.log)
        return self._generator

    # -- state ---------------------------------------------------------------------------------
    def info(self) -> SessionInfo:
        """The session as the API describes it now."""
        s = self.conn.call(
            lambda: self.conn.sdk().post_training.sessions.retrieve(self.id),
            f"read session {self.id}",
        )
        self._info = SessionInfo.from_sdk(s)
        self.log.set_step(self._info.step)
        return self._info

    @property
    def status(self) -> str:
        return self.info().status

    @property
    def step(self) -> int:
        """The session's step, read from the API (not counted here: a session the service
        rolled back to its last training checkpoint is at that checkpoint's step)."""
        return self.info().step

    def record(self, step: int | None = None, **metrics: Any) -> dict[str, Any]:
        """Note client-side metrics (``reward_mean=0.4``) at `step` (default: the current step).
        They are drawn by the panel beside the loss."""
        values = v.check_metrics(metrics)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            from tgnb.errors import ValidationError

            raise ValidationError(f"step={step!r} must be a whole number >= 0")
        return self.log.record(step, **values)

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, kind: str = "inference") -> CheckpointInfo:
        """Create a checkpoint: ``"training"`` (weights and optimizer, to resume) or
        ``"inference"`` (the weights, to download or serve).

        Both hold the trainer's weights at its current step (as Together documents them;
        ``weights_version`` says which policy version), whatever was last published for
        sampling: saving publishes nothing."""
        if kind not in ("training", "inference"):
            from tgnb.errors import ValidationError

            raise ValidationError(f"checkpoint kind {kind!r}: use 'training' or 'inference'")
        fn = (
            self.client.create_training_checkpoint
            if kind == "training"
            else self.client.create_inference_checkpoint
        )
        ck = self.conn.call(fn, f"save a checkpoint ({kind}) of session {self.id}")
        self.log.operation(f"{kind}-checkpoint")
        return CheckpointInfo.from_sdk(ck, kind, self.id)

    def checkpoints(self) -> list[CheckpointInfo]:
        return list(self.info().checkpoints)

    def download(
        self,
        checkpoint_id: str | None = None,
        variant: str = "adapter",
        out: str | Path = ".",
    ) -> list[Path]:
        """Download a checkpoint's files (default: this session's latest inference checkpoint)."""
        from tgnb.posttraining._connect import download

        variant_name = v.check_variant(variant)
        out_dir = v.check_out_dir(out)
        if checkpoint_id is None:
            infer = [c for c in self.checkpoints() if c.kind == "inference"]
            if not infer:
                from tgnb.errors import ValidationError

                raise ValidationError(
                    f"session {self.id} has no inference checkpoint yet: save one with "
                    "sess.save('inference')"
                )
            checkpoint_id = infer[-1].id
        return download(self.conn, checkpoint_id, variant_name, out_dir)

    # -- lifecycle -----------------------------------------------------------------------------
    def stop(self) -> SessionInfo:
        """Stop the session (its LoRA slot is freed); returns its final state."""
        self.conn.call(self.client.stop, f"stop session {self.id}")
        return self.info()

    def detach(self) -> None:
        """Release this handle; the session keeps running on the service."""
        self.client.detach()


__all__ = ["TrainingSession"]
