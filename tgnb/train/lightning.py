"""`protect(trainer)` for a PyTorch Lightning ``Trainer``: the guarantees of `tgnb.train.protect`.

::

    trainer = L.Trainer(max_steps=300, default_root_dir="out")
    tgnb.train.protect(trainer)        # or protect(trainer, checkpoint={"every_steps": 50})
    trainer.fit(model, train_loader)   # resumes from the newest complete checkpoint by itself

`protect` adds `TgnbLightningCallback` to the trainer and makes ``trainer.fit`` an instance
attribute calling the class's own. The callback drives `tgnb.train.preemption.CheckpointGuard`
as the `Checkpointer` loop does (`tgnb.train.loop`): at each optimizer step's end
(``on_train_batch_end`` once the step counter moved) every rank agrees on the SIGTERM / SIGUSR1 /
drain-notice flags and saves what is due; a stop saves synchronously, seals the checkpoint and
sets ``trainer.should_stop``; ``fit`` then exits the process with 75 (`Exit.PREEMPTED`), 74 on a
full disk. Model and optimizer go through the same DCP path (``dcpio.State``: resharded at another
world size), the scheduler as JSON, the fit loop's progress (``lightning.json``) and each rank's
RNG beside them. Resume happens at ``on_fit_start`` -- modules and optimizers exist, the loops have
not run -- exactly where Lightning restores its own checkpoints' training state; at
``on_train_start`` the loader's iterator moves past the batches the resumed epoch already trained
on and the RNG comes back, so a resumed run ends bit for bit as the uninterrupted one. A shuffled
``DataLoader`` (``shuffle=True``: a ``RandomSampler`` drawing each epoch's order from the global
RNG) resumes in the same order: the callback makes each epoch's iterator from an RNG state it keeps
(``epoch_rng`` in ``lightning.json``, taken at ``on_train_epoch_start``), and a resume midway makes
the iterator again from that state before it skips the trained batches (a ``DistributedSampler``
orders by seed and epoch). The order replays exactly as long as no hook of the program draws from
the RNG between the epoch's start and its first batch. At another world size than the checkpoint's
a batch index covers other samples: the checkpoint keeps the samples of the epoch trained by all
ranks (``epoch_samples``), and Lightning's ``DistributedSampler`` continues the epoch's order from
there (`tgnb.train.order`), with a line stating the global batch's change.

Lightning's own SIGTERM handler would end ``fit`` with a `SIGTERMException` (exit 0) before the
guard saved; the callback hands SIGTERM back to the guard when training starts (Lightning gives
the handlers back at teardown, the guard after it). ``fit(ckpt_path=...)`` is refused: the run
resumes from its own newest complete checkpoint. Where the run directory is: as `protect`
(``$TGNB_RUN_DIR`` under tgnb; else ``trainer.default_root_dir``).
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tgnb.errors import TrainConfigError
from tgnb.runs.node import Exit
from tgnb.train import dcpio
from tgnb.train.order import elastic, global_batch_line
from tgnb.train.preemption import CheckpointGuard
from tgnb.train.record import Recorder, number, run_failed, run_started
from tgnb.train.saving import no_space

__all__ = ["LIGHTNING_STATE", "TgnbLightningCallback", "callback_for", "protect_lightning"]

#: The fit loop's progress in a checkpoint (rank 0).
LIGHTNING_STATE = "lightning.json"


class TgnbLightningCallback:
    """The guard as Lightning hooks (see the module docstring); `callback_for` makes it a
    ``Callback`` of the trainer's own package (``lightning`` or ``pytorch_lightning``)."""

    def __init__(self, guard: CheckpointGuard, recorder: Recorder) -> None:
        self.guard = guard
        self.recorder = recorder
        self.step = 0  # the last optimizer step completed
        self.max_steps = 0
        self._trainer: Any = None
        self._rng: Path | None = None  # the checkpoint resumed from, until its RNG is restored
        #: the RNG state this epoch's loader iterator was made from, when a loader shuffles by it
        self._epoch_rng: torch.Tensor | None = None
        self.epoch_samples = 0  # samples of this epoch trained by all ranks together
        self._saved: dict[str, Any] = {}  # lightning.json of the checkpoint resumed from

    @property
    def state_key(self) -> str:
        return "tgnb"

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if len(trainer.optimizers) != 1:
            raise TrainConfigError(
                f"tgnb protects a LightningModule with one optimizer; configure_optimizers() "
                f"returned {len(trainer.optimizers)}"
            )
        configs = trainer.lr_scheduler_configs
        self._trainer = trainer
        state = dcpio.State(
            pl_module,
            trainer.optimizers[0],
            configs[0].scheduler if len(configs) == 1 else None,
            write=self._write,
        )
        self.guard.attach(state)  # every rank, at the same point (the process group is up)
        run_started(
            self.recorder,
            algorithm="lightning",
            model=type(pl_module).__name__,
            max_steps=int(trainer.max_steps) if int(trainer.max_steps) > 0 else None,
            world_size=dcpio.world(),
            pid=os.getpid(),
        )
        path = self.guard.resume_from()
        if path is None:
            return
        found = self.guard.resumed
        assert found is not None
        dcpio.load(found.path, state, False)
        saved = json.loads((found.path / LIGHTNING_STATE).read_text(encoding="utf-8"))
        trainer.fit_loop.load_state_dict(saved["fit_loop"])  # as Lightning's own restore does
        self.step = found.step
        self._saved = saved
        if epoch_rng := saved.get("epoch_rng"):
            self._epoch_rng = torch.frombuffer(
                bytearray(base64.b64decode(epoch_rng)), dtype=torch.uint8
            )
        self._rng = found.path

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # Lightning registered its SIGTERM handler (ends fit with exit 0): the guard's flag instead
        self.guard.stops.own()
        if self._rng is not None:  # resumed: the loader made its iterator (setup_data) by now
            self.epoch_samples = _skip_done_batches(trainer, self._epoch_rng, self._saved)
            dcpio.load_rng(self._rng)  # after the iterator's own draw, as at the step it saved
            self._rng = None
        total = trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
        self.max_steps = int(total) if math.isfinite(total) else sys.maxsize

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        # the state the epoch's order is drawn from: made here for the first epoch (Lightning
        # made that iterator before any hook), by Lightning right after this hook for the others
        loop = trainer.fit_loop
        self.epoch_samples = 0  # not called for an epoch resumed midway
        if loop._combined_loader is None or not any(
            map(_shuffled, loop._combined_loader.flattened)
        ):
            self._epoch_rng = None
            return
        self._epoch_rng = torch.get_rng_state()
        if trainer.current_epoch == 0 and loop._data_fetcher is not None:
            iter(loop._data_fetcher)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int) -> None:
        if int(trainer.global_step) == self.step:
            self.guard.schedule.step_began()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        self.epoch_samples += _batch_size(batch) * dcpio.world()
        step = int(trainer.global_step)
        if step == self.step:  # accumulating: no optimizer step yet
            return
        self.step = step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        row = {"loss": n} if (n := number(loss)) is not None else {}
        groups = trainer.optimizers[0].param_groups
        if (lr := number(groups[0].get("lr"))) is not None:
            row["learning_rate"] = lr
        self.recorder.metric(step, **row)
        batch_size = _batch_size(batch) * dcpio.world() * int(trainer.accumulate_grad_batches)
        if self.guard.step_boundary(step, self.max_steps, batch_size, dcpio.flags_device()):
            trainer.should_stop = True

    def _write(self, path: Path) -> None:  # rank 0, in every save
        trainer = self._trainer
        dcpio.write_json(
            path / LIGHTNING_STATE,
            {
                "step": self.step,
                "epoch": trainer.current_epoch,
                "world_size": dcpio.world(),
                "epoch_samples": self.epoch_samples,
                "fit_loop": trainer.fit_loop.state_dict(),
                "epoch_rng": None
                if self._epoch_rng is None
                else base64.b64encode(self._epoch_rng.numpy().tobytes()).decode("ascii"),
            },
        )


def _shuffled(loader: Any) -> bool:
    """Whether `loader` draws each epoch's order from the global RNG: a sampler whose
    ``generator`` is left None (``RandomSampler``: ``shuffle=True``) and has no ``set_epoch``."""
    batches = getattr(loader, "batch_sampler", None)
    for obj in (getattr(loader, "sampler", None), getattr(batches, "sampler", None)):
        if getattr(obj, "generator", False) is None and not hasattr(obj, "set_epoch"):
            return True
    return False


def _skip_done_batches(trainer: Any, epoch_rng: torch.Tensor | None, saved: dict[str, Any]) -> int:
    """Move the train loader's fresh iterator past the samples the resumed epoch already trained
    on; return their number (all ranks). Lightning restores its progress counters but starts a
    plain ``DataLoader`` over from its first batch (it only repositions loaders with
    ``state_dict``): the resumed epoch would train on its first batches again and never reach its
    last ones. The samplers get the epoch first (a ``DistributedSampler`` then draws the epoch's
    own order); with `epoch_rng`, the RNG state the epoch's iterator was made from (a
    ``RandomSampler`` draws its order from it), the iterator is made again from that state, so
    the epoch comes in its own order. At the world size saved the iterator skips the batches
    trained; at another one a batch index covers other samples, so the ``DistributedSampler``
    continues from the sample position instead (`tgnb.train.order`) and the batch counters are
    set to the batches of the new size those samples make."""
    loop = trainer.fit_loop
    progress = loop.epoch_loop.batch_progress.current
    done = int(progress.processed)
    fetcher, loader = loop._data_fetcher, loop._combined_loader
    world, saved_world = dcpio.world(), int(saved.get("world_size") or dcpio.world())
    samples = int(saved.get("epoch_samples") or 0)
    if world != saved_world:  # the batches saved were of another size: count in samples
        done = int(done and 0 < samples < _epoch_size(loader))
    if fetcher is None or loader is None or not 0 < done < loop.max_batches:
        return 0  # nothing trained in this epoch yet, or it ended at the step saved
    epoch = int(loop.epoch_progress.current.processed)
    for dl in loader.flattened:  # as the fit loop does at each epoch's start
        batches = getattr(dl, "batch_sampler", None)
        for obj in {getattr(dl, "sampler", None), batches, getattr(batches, "sampler", None)}:
            if callable(set_epoch := getattr(obj, "set_epoch", None)):
                set_epoch(epoch)
    if world != saved_world and _continue_at_samples(trainer, saved_world, samples, epoch):
        return samples
    if epoch_rng is not None:
        torch.set_rng_state(epoch_rng)
        iter(fetcher)
    pending = getattr(fetcher, "batches", [])  # prefetched (a loader without a length)
    ahead = len(pending)
    dropped = min(done, ahead)
    del pending[:dropped]
    try:
        for _ in range(done - dropped):
            next(fetcher.iterator)
        while len(pending) < ahead:
            pending.append(next(fetcher.iterator))
    except StopIteration:
        fetcher.done = not pending
    return samples


def _continue_at_samples(trainer: Any, saved_world: int, samples: int, epoch: int) -> bool:
    """`_skip_done_batches` at another world size than the checkpoint's: each train loader's
    ``DistributedSampler`` (Lightning's own, ``use_distributed_sampler=True``) hands out the rest
    of the epoch's global order from `samples`. False, with a line saying so, where a loader has
    another sampler (no order shared by every world size): the batches are skipped by index."""
    loop = trainer.fit_loop
    world = dcpio.world()
    loaders = list(loop._combined_loader.flattened)
    samplers = [elastic(getattr(dl, "sampler", None)) for dl in loaders]
    if None in samplers or not all(getattr(dl, "batch_size", None) for dl in loaders):
        if dcpio.rank() == 0:
            print(
                f"tgnb: resumed mid-epoch at world size {world} (saved at {saved_world}) with a "
                "train DataLoader whose order is not the same at every world size: the epoch "
                "skips its trained batches by index, so some samples may be trained twice or "
                "not at all until it ends; Lightning's DistributedSampler (Trainer(strategy="
                "'ddp', use_distributed_sampler=True)) at every world size continues from the "
                "sample position",
                file=sys.stderr,
                flush=True,
            )
        return False
    for sampler in samplers:
        assert sampler is not None
        sampler.resume_at(epoch, samples)
    batch = int(loaders[0].batch_size)
    progress = loop.epoch_loop.batch_progress.current
    shift = samples // (batch * world) - progress.processed  # to the batches of the new size
    progress.ready += shift
    progress.started += shift
    progress.processed += shift
    progress.completed += shift
    iter(loop._data_fetcher)  # the iterator again, from the sampler's new position
    if dcpio.rank() == 0:
        print(global_batch_line(saved_world, world, batch), file=sys.stderr, flush=True)
    return True


def _epoch_size(loader: Any) -> int:
    """The samples of an epoch of `loader` (a ``CombinedLoader``), all ranks together; 0 where a
    dataset has no length."""
    try:
        return sum(len(dl.dataset) for dl in loader.flattened) if loader is not None else 0
    except (AttributeError, TypeError):
        return 0


def _batch_size(batch: Any) -> int:
    first = batch[0] if isinstance(batch, list | tuple) and batch else batch
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 0


def callback_for(trainer: Any, guard: CheckpointGuard, recorder: Recorder) -> Any:
    """A `TgnbLightningCallback` that is a ``Callback`` of `trainer`'s package (Lightning
    checks callbacks by its own class)."""
    roots = [c.__module__.split(".")[0] for c in type(trainer).__mro__ if c.__name__ == "Trainer"]
    package = (
        "pytorch_lightning" if roots and roots[0] == "pytorch_lightning" else "lightning.pytorch"
    )
    base = importlib.import_module(package).Callback
    cls = type("TgnbLightningCallback", (TgnbLightningCallback, base), {})
    return cls(guard, recorder)


def protect_lightning(trainer: Any, ctx: Any) -> Any:
    """`tgnb.train.protect` for a Lightning ``Trainer`` in `ctx` (a `tgnb.train.protect.RunContext`):
    the callback and ``fit``."""
    recorder = Recorder(ctx.run_dir, ctx.name)
    guard = CheckpointGuard(ctx.policy, ctx.run_dir, recorder)
    callback = callback_for(trainer, guard, recorder)
    trainer.callbacks.append(callback)
    original = type(trainer).fit

    def fit(*args: Any, **kwargs: Any) -> None:
        if kwargs.get("ckpt_path") is not None or len(args) >= 5:
            raise TrainConfigError(
                "a protected Trainer resumes from its newest complete checkpoint by itself: "
                "call trainer.fit(model, ...) without ckpt_path"
            )
        try:
            original(trainer, *args, **kwargs)
            code = int(guard.finish_at(callback.step, callback.max_steps or callback.step))
        except OSError as exc:
            guard.close()
            if not no_space(exc):
                run_failed(recorder, exc, callback.step)
                raise
            print(f"tgnb: disk full under {ctx.run_dir}: {exc}", file=sys.stderr, flush=True)
            code = int(Exit.NO_SPACE)
        except BaseException as exc:
            guard.close()
            if not isinstance(exc, SystemExit | KeyboardInterrupt):
                run_failed(recorder, exc, callback.step)
            raise
        if code:
            print(guard.stopped_line(callback.step, ctx.managed), file=sys.stderr)
            recorder.close()
            sys.stdout.flush()
            if dist.is_available() and dist.is_initialized():  # else gloo can abort the exit
                dist.destroy_process_group()
            sys.exit(code)

    trainer.fit = fit
    trainer._tgnb_guard = guard
    return trainer
