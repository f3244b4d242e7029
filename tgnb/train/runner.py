"""Run one training job: build the TRL trainer from a `TrainConfig`, wrap it with the checkpoint
guard, train (resuming from the newest complete checkpoint), and return the exit code.

Run directory layout::

    run.yaml        the resolved config
    checkpoints/    checkpoint-<step>/ directories (DCP shards + JSON, tgnb.train.dcpio), sealed
                    by tgnb.train.checkpoint; quarantine/ holds those that failed verification
    metrics.jsonl   one row per logged step (tgnb.train.metrics)
    events.jsonl    RunStarted, RunResumed, SignalReceived, CheckpointSaved, RunExited, ...

Checkpointing is configured in one place only, `tgnb.train.preemption.CheckpointGuard`, which the
runner gives the trainer through `tgnb.train.protect` as any user's script does. Several
processes (``torchrun``, ``accelerate launch``) are handled by transformers/accelerate; nothing
here is rank-specific except that rank 0 writes ``run.yaml`` (the Recorder writes on rank 0 only).
A run resumed at another world size keeps its global batch (gradient accumulation adapts).

Exit codes: 0 finished, 75 preempted (`EXIT_PREEMPTED`), 74 the disk is full (`Exit.NO_SPACE`; the
last complete checkpoint is intact), else an exception (the CLI exits 1 or 2).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.tasks import assets, data, rewards
from tgnb.tasks.config import DEFAULT_REWARDS, TrainConfig
from tgnb.tasks.tuning import tuning
from tgnb.train.record import Recorder, rank
from tgnb.train.validate import trl_config_class, validate


def training_kwargs(cfg: TrainConfig, cuda: bool) -> dict[str, Any]:
    """Keyword arguments for ``GRPOConfig``/``DPOConfig`` before the guard adds its own: our
    defaults (CPU-friendly when there is no GPU; a built-in model's `tgnb.tasks.tuning`), then
    ``cfg.trl``."""
    kwargs: dict[str, Any] = {"logging_steps": 1, "report_to": "none", "disable_tqdm": True}
    if not cuda:
        kwargs.update(use_cpu=True, bf16=False)
    tune = tuning(cfg.model)
    if tune is not None:
        kwargs.update(tune.trl.get(cfg.algorithm, {}))
    if not {"gradient_checkpointing", "activation_checkpointing"} & set(cfg.trl):
        # transformers 5 renamed gradient_checkpointing (TRL defaults it to True; the old name
        # warns): keep TRL's default under the new name, unless the model's tuning says
        ckpt = None if tune is None else tune.activation_checkpointing
        fields = {f.name: f for f in dataclasses.fields(trl_config_class(cfg.algorithm))}
        if "activation_checkpointing" in fields:
            kwargs["activation_checkpointing"] = (
                ckpt if ckpt is not None else fields["gradient_checkpointing"].default
            )
        elif ckpt is not None:
            kwargs["gradient_checkpointing"] = ckpt
    weights = None if tune is None else tune.reward_weights
    if weights and cfg.algorithm == "grpo" and cfg.rewards == DEFAULT_REWARDS:
        kwargs["reward_weights"] = list(weights)
    kwargs.update(cfg.trl)
    if not cuda:  # mixed precision needs a GPU: off here, with a notice (it failed on the node)
        for key in ("bf16", "fp16"):
            if kwargs.get(key):
                kwargs[key] = False
                print(
                    f"tgnb: trl.{key}=true needs a GPU and this node has none: training in "
                    f"float32 ({key} off)",
                    file=sys.stderr,
                    flush=True,
                )
    kwargs.update(max_steps=cfg.max_steps, seed=cfg.seed)
    return kwargs


def _load_tokenizer(model: str, source: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainConfigError(
            f"model '{model}' could not be loaded ({first}); check the id or path, or put it in "
            "the Hugging Face cache for offline use."
        ) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _args(cfg: TrainConfig, kwargs: dict[str, Any]) -> Any:
    cls = trl_config_class(cfg.algorithm)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainConfigError(f"TRL rejected the options under 'trl': {first}") from None


def build_trainer(
    cfg: TrainConfig, args: Any, callbacks: list[Any], source: str | None = None
) -> Any:
    """The GRPOTrainer, DPOTrainer or SFTTrainer for `cfg` (model and reference loaded from the same source).

    `source` is what `assets.resolve_model` returns; resolve it before the training arguments are
    built when several processes run (they start torch.distributed, after which transformers
    writes the tiny model on rank 0 only)."""
    source = source or assets.resolve_model(cfg.model, cfg.seed)
    tokenizer = _load_tokenizer(cfg.model, source)
    assert cfg.dataset is not None
    dataset = data.load(
        cfg.dataset,
        seed=cfg.seed,
        split=cfg.dataset_split,
        size=cfg.dataset_size,
        config_name=cfg.dataset_config,
    )
    peft_config = None
    if cfg.lora is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(**{"task_type": "CAUSAL_LM", **cfg.lora})
    common: dict[str, Any] = {
        "model": source,  # a path or id: TRL loads it, and DPO its reference, from the same place
        "args": args,
        "train_dataset": dataset,
        "processing_class": tokenizer,
        "callbacks": callbacks,
        "peft_config": peft_config,
    }
    if cfg.algorithm == "grpo":
        from trl import GRPOTrainer

        funcs: list[Any] = list(rewards.resolve_all(cfg.rewards, list(dataset.column_names)))
        trainer: Any = GRPOTrainer(reward_funcs=funcs, **common)
    elif cfg.algorithm == "sft":
        from trl import SFTTrainer

        trainer = SFTTrainer(**common)
    else:
        from trl import DPOTrainer

        trainer = DPOTrainer(**common)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # metrics go out as @tgnb lines instead
    return trainer


def run(cfg: TrainConfig, launched: bool = False) -> int:
    """Train `cfg` to its max_steps, or until preempted; 0 finished. A preemption or a full disk
    leaves through ``SystemExit`` with `Exit.PREEMPTED` / `Exit.NO_SPACE` (`tgnb.train.protect`).

    The built-in runs are one client of `tgnb.train.protect`: build the TRL trainer, protect it,
    train. Raises `TrainConfigError` for bad input before anything is trained (`launched`: a
    launch validated `cfg`; what needs the node is checked).
    """
    validate(cfg, launched=launched)
    import torch
    from transformers import set_seed

    from tgnb.train.callback import batch_args
    from tgnb.train.protect import protect_with

    assert cfg.run_dir is not None
    run_dir = Path(cfg.run_dir)
    if rank() == 0:
        Recorder(run_dir, cfg.name).close()  # the run directory, before run.yaml
        cfg.dump(run_dir / "run.yaml")
    set_seed(cfg.seed)
    tune = tuning(cfg.model)
    if tune is not None and tune.cpu_threads and not torch.cuda.is_available():
        torch.set_num_threads(tune.cpu_threads)
    source = assets.resolve_model(cfg.model, cfg.seed)  # before torch.distributed starts
    kwargs = training_kwargs(cfg, torch.cuda.is_available())
    kwargs["output_dir"] = str(run_dir / "checkpoints")
    kwargs = batch_args(run_dir / "checkpoints", kwargs, int(os.environ.get("WORLD_SIZE", "1")))
    args = _args(cfg, kwargs)
    trainer = build_trainer(cfg, args, [], source)
    info = {"algorithm": cfg.algorithm, "model": cfg.model, "dataset": cfg.dataset}
    protect_with(trainer, cfg.checkpoint, run_dir, cfg.name or run_dir.name, info)
    trainer.train()
    if torch.distributed.is_initialized():  # else gloo's threads can abort the exit (SIGABRT)
        torch.distributed.destroy_process_group()
    return 0
