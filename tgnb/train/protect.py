"""`protect(trainer)`: what tgnb's built-in runs have, for any Hugging Face or TRL Trainer, in one line.

::

    trainer = SFTTrainer(model=..., args=SFTConfig(output_dir="out", max_steps=300), ...)
    tgnb.train.protect(trainer)        # or protect(trainer, checkpoint={"every_steps": 50})
    trainer.train()                    # resumes from the newest complete checkpoint by itself

It gives `trainer` (``transformers.Trainer``, ``SFTTrainer``, ``GRPOTrainer``, ``DPOTrainer``, a
subclass) the `tgnb.train.preemption.CheckpointGuard` (through `tgnb.train.callback`): on SIGTERM, SIGUSR1 or a Slurm drain notice,
every rank stops at the same optimizer-step boundary and saves synchronously; periodic saves are
asynchronous DCP shards (``checkpoint.auto`` by default); a checkpoint that fails verification is
quarantined; ``trainer.train()`` resumes from the newest complete checkpoint, at any world size
with the global batch kept, and needs no argument. ``metrics.jsonl`` and ``events.jsonl`` are
written so the cockpit shows the run. A W&B or MLflow run that ``report_to`` names is one run
across preemptions and restarts, with tgnb's events in it (`tgnb.train.tracker`).

When it stops for a preemption, ``trainer.train()`` exits the process with 75 (`Exit.PREEMPTED`:
the engine starts it again, and it resumes); a full disk exits 74. Finished, it returns the
Trainer's own result, and the script goes on (``trainer.save_model()``...).

Where: under tgnb (``session.launch("train.py")``) the run directory and the checkpoint policy come
from the launch (`tgnb.runs.node`'s environment: the policy is the run file's, which
``$TGNB_CONFIG`` names, and wins over `checkpoint`; ``$TGNB_CHECKPOINT`` is its view, read only
where no run file is named).
Anywhere else -- a plain ``python train.py`` -- the run directory is ``args.output_dir`` and its
checkpoints ``output_dir/checkpoints``: the same script runs unchanged, and run again it resumes.

What `protect` changes on the trainer, all through public APIs but one: the training arguments the
guard owns (``save_strategy="no"``: the guard saves; ``enable_jit_checkpoint`` off; data skipping
on resume on), two callbacks, ``gradient_accumulation_steps`` when resuming at another world size,
its class (`resumable`'s one override of ``_load_from_checkpoint``: the guard loads DCP state) and
its ``train`` method (an instance attribute calling the class's own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.runs import node
from tgnb.runs.policy import CheckpointPolicy

__all__ = ["RunContext", "protect", "protect_with", "run_context"]


@dataclasses.dataclass(frozen=True)
class RunContext:
    """Where a protected program keeps its run, and its checkpoint policy."""

    run_dir: Path
    name: str
    policy: CheckpointPolicy
    managed: bool  # launched by tgnb (the node contract's environment is set)


def _policy(given: CheckpointPolicy | dict[str, Any] | None) -> CheckpointPolicy:
    """`given`, with the launch's policy over it (the launch wins: the cockpit set it): the run
    file's (`launched_policy`), else ``$TGNB_CHECKPOINT``'s keys (a job rendered before)."""
    policy = given if isinstance(given, CheckpointPolicy) else CheckpointPolicy.parse(given)
    from_run_file = launched_policy()
    if from_run_file is not None:
        return from_run_file
    launched = os.environ.get(node.CHECKPOINT_ENV)
    if launched:
        policy = policy.merged(_launched(launched), f"checkpoint key in ${node.CHECKPOINT_ENV}")
    return policy


def launched_policy() -> CheckpointPolicy | None:
    """The checkpoint policy of the run file the runtime runs (`tgnb.runs.node.RUN_FILE_ENV`,
    loaded typed: `tgnb.runs.runfile.RunFile.load`), or None where no run file is named
    (not launched by tgnb, or by a job rendered before the run file)."""
    path = os.environ.get(node.RUN_FILE_ENV)
    if not path or Path(path).name != node.RUN_FILE:
        return None
    from tgnb.runs.runfile import RunFile

    return RunFile.load(path).train.checkpoint


def _launched(text: str) -> dict[str, Any]:
    """The policy in ``$TGNB_CHECKPOINT``: a JSON object of `CheckpointPolicy` keys."""
    name = node.CHECKPOINT_ENV
    fix = (
        f"set it to a JSON object of checkpoint keys, e.g. {name}='{{\"every_steps\": 50}}', "
        "or unset it (tgnb sets it for the runs it launches)"
    )
    try:
        keys = json.loads(text)
    except ValueError as exc:  # json.JSONDecodeError, or a number too long to convert
        raise TrainConfigError(f"${name} is not valid JSON ({exc}): {fix}") from None
    if not isinstance(keys, dict):
        raise TrainConfigError(f"${name} holds {text!r:.40}, not a JSON object: {fix}")
    return keys


def run_context(
    output_dir: str | os.PathLike[str] | None,
    checkpoint: CheckpointPolicy | dict[str, Any] | None = None,
) -> RunContext:
    """The run directory and policy: the launch's (`tgnb.runs.node` environment), else
    `output_dir` with `checkpoint` (or the defaults)."""
    policy = _policy(checkpoint)
    run_dir = os.environ.get(node.RUN_DIR_ENV)
    if run_dir:
        return RunContext(
            Path(run_dir), os.environ.get(node.RUN_ENV) or Path(run_dir).name, policy, True
        )
    if output_dir is None:
        raise TrainConfigError("not launched by tgnb: give the directory to checkpoint into")
    out = Path(output_dir).expanduser().resolve()
    return RunContext(out, out.name, policy, False)


def _is_lightning(trainer: Any) -> bool:
    """Whether `trainer` is a Lightning ``Trainer`` (``lightning`` or ``pytorch_lightning``;
    read from its classes, so Lightning is imported only when it is one)."""
    return any(
        cls.__name__ == "Trainer"
        and cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
        for cls in type(trainer).__mro__
    )


def _kind(trainer: Any) -> str:
    for cls in type(trainer).__mro__:
        name = cls.__name__.removeprefix("Resumable")
        if name in ("GRPOTrainer", "DPOTrainer", "SFTTrainer"):
            return name.removesuffix("Trainer").lower()
    return "trainer"


def _own_args(trainer: Any, guard: Any) -> None:
    from transformers.trainer_utils import SaveStrategy

    from tgnb.train.callback import batch_args

    args = trainer.args
    args.save_strategy = SaveStrategy.NO
    args.save_total_limit = None
    args.enable_jit_checkpoint = False
    args.ignore_data_skip = False
    with_jit = [
        cb
        for cb in trainer.callback_handler.callbacks
        if type(cb).__name__ == "JITCheckpointCallback"
    ]
    for cb in with_jit:  # its SIGTERM handler would race the guard's
        trainer.remove_callback(cb)
    world = int(args.world_size)
    kwargs = {
        "per_device_train_batch_size": int(args.per_device_train_batch_size),
        "gradient_accumulation_steps": int(args.gradient_accumulation_steps),
    }
    steps = batch_args(guard.ckpt_dir, kwargs, world)["gradient_accumulation_steps"]
    if steps != kwargs["gradient_accumulation_steps"]:
        if _kind(trainer) == "grpo":  # TRL sized its generation batches at construction
            raise TrainConfigError(
                f"this GRPO checkpoint was written at another world size: build GRPOConfig with "
                f"gradient_accumulation_steps={steps} to keep its global batch"
            )
        args.gradient_accumulation_steps = steps


def protect(
    trainer: Any,
    checkpoint: CheckpointPolicy | dict[str, Any] | None = None,
) -> Any:
    """Give `trainer` tgnb's checkpoint-on-preemption and resume (see the module docstring);
    returns it. Call it once, after building the trainer and before ``trainer.train()``."""
    if getattr(trainer, "_tgnb_guard", None) is not None:
        return trainer
    if _is_lightning(trainer):
        from tgnb.train.lightning import protect_lightning

        return protect_lightning(trainer, run_context(trainer.default_root_dir, checkpoint))
    if not hasattr(trainer, "args"):
        raise TrainConfigError(
            f"protect() takes a Hugging Face/TRL Trainer or a Lightning Trainer, not "
            f"{type(trainer).__name__}; for a plain loop use tgnb.train.Checkpointer"
        )
    ctx = run_context(trainer.args.output_dir, checkpoint)
    return protect_with(trainer, ctx.policy, ctx.run_dir, ctx.name, {}, managed=ctx.managed)


def protect_with(
    trainer: Any,
    policy: CheckpointPolicy,
    run_dir: Path,
    name: str,
    info: dict[str, Any],
    managed: bool = True,
) -> Any:
    """`protect` with the run directory, policy and ``RunStarted`` details given (the built-in
    runner's entry: its config holds them)."""
    from tgnb.train.callback import GuardCallback, resumable
    from tgnb.train.metrics import MetricsCallback
    from tgnb.train.ownership import identity
    from tgnb.train.preemption import CheckpointGuard
    from tgnb.train.record import Recorder, number
    from tgnb.train.tracker import open_trackers

    ctx = RunContext(Path(run_dir), name, policy, managed)
    recorder = Recorder(ctx.run_dir, ctx.name)
    # before the Trainer's own W&B/MLflow callbacks set up: they log into the run opened here
    open_trackers(recorder, getattr(trainer.args, "report_to", None), metrics=False)
    guard = CheckpointGuard(ctx.policy, ctx.run_dir, recorder)
    args = trainer.args  # what makes it another run in the same directory (`ownership`)
    named = ctx.name if os.environ.get(node.RUN_ENV) else None  # tgnb's name for the run
    guard.identity = identity(named, seed=int(args.seed), learning_rate=number(args.learning_rate))
    try:
        _own_args(trainer, guard)
    except BaseException:
        guard.close()
        raise
    for callback in (GuardCallback(guard), MetricsCallback(recorder)):
        trainer.add_callback(callback)
    trainer.__class__ = resumable(type(trainer))
    guard.attach(trainer)
    original = type(trainer).train
    details = {"algorithm": _kind(trainer), **info}

    def train(resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        if isinstance(resume_from_checkpoint, str):
            raise TrainConfigError(
                "a protected trainer resumes from its newest complete checkpoint by itself: "
                "call trainer.train() without resume_from_checkpoint"
            )

        def call(path: str | None) -> Any:
            return original(trainer, resume_from_checkpoint=path, **kwargs)

        return _train(trainer, guard, recorder, ctx, details, call)

    trainer.train = train
    trainer._tgnb_guard = guard
    return trainer


def _max_steps(trainer: Any) -> int | None:
    args = trainer.args
    if int(args.max_steps) > 0:
        return int(args.max_steps)
    try:
        n = len(trainer.get_train_dataloader())
    except (TypeError, ValueError):
        return None
    ga = int(args.gradient_accumulation_steps)
    per_epoch = max(n // ga + int(n % ga > 0), 1)
    return int(per_epoch * float(args.num_train_epochs))


def _train(
    trainer: Any, guard: Any, recorder: Any, ctx: RunContext, details: dict[str, Any], call: Any
) -> Any:
    from tgnb.train.metrics import run_failed, run_started
    from tgnb.train.saving import no_space

    model = getattr(getattr(trainer.model, "config", None), "_name_or_path", "") or ""
    run_started(
        recorder,
        **{"model": str(model), **details},
        max_steps=_max_steps(trainer),
        seed=int(trainer.args.seed),
        world_size=int(trainer.args.world_size),
        pid=os.getpid(),
    )
    try:
        out = call(guard.resume_from())
    except OSError as exc:
        guard.close()
        if not no_space(exc):
            run_failed(recorder, exc, int(trainer.state.global_step))
            raise
        print(
            f"tgnb: disk full under {ctx.run_dir}: {exc}; exiting {int(node.Exit.NO_SPACE)}",
            file=sys.stderr,
        )
        raise SystemExit(int(node.Exit.NO_SPACE)) from None
    except BaseException as exc:
        guard.close()
        if not isinstance(exc, SystemExit | KeyboardInterrupt):
            run_failed(recorder, exc, int(trainer.state.global_step))
            with contextlib.suppress(AttributeError, TypeError):
                exc._tgnb_recorded = True  # type: ignore[attr-defined]
        raise
    code = int(guard.finish(trainer))
    if code:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():  # else gloo can abort the exit
            dist.destroy_process_group()
        print(
            guard.stopped_line(trainer.state.global_step, ctx.managed), file=sys.stderr, flush=True
        )
        raise SystemExit(code)
    return out
