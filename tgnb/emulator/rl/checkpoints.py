"""Checkpoints of a session, as safetensors + JSON (nothing pickled), and their downloads.

A checkpoint directory holds ``meta.json`` (format, type, mode, base model, step, policy version,
LoRA config, optimizer kind and param groups) and the weights:

- LoRA: ``adapter_model.safetensors`` + ``adapter_config.json``, peft's own format (the directory
  loads with ``peft.PeftModel.from_pretrained(base, directory)``);
- full weight: ``config.json`` + ``model*.safetensors`` (``save_pretrained``'s files).

A TRAINING checkpoint holds the trainer's weights and ``optimizer.safetensors`` (the optimizer's
state tensors; its scalar state and param groups in ``meta.json``); an INFERENCE checkpoint holds
the trainer's weights alone: the weights at the step it was taken, as Together documents it ("snapshots
the model weights", its ``step`` "Training step at time of save"), whatever was last published
(a weights-sync) for sampling. Loading a training checkpoint publishes the loaded weights
(policy version = the checkpoint's step) and, with ``load_optimizer``, restores the Adam/Muon state.

`export` writes the ADAPTER variant (the adapter files) or the MERGED one (the adapter merged into
the base: ``model.safetensors`` + ``config.json`` + tokenizer files, loadable with
``AutoModelForCausalLM.from_pretrained``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgnb.emulator.rl.inputs import RLInputError

if TYPE_CHECKING:
    from tgnb.emulator.rl.engine import LoraSession, ResourceHost

FORMAT = "tgnb-rl-checkpoint-1"
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
VARIANTS = ("CHECKPOINT_VARIANT_ADAPTER", "CHECKPOINT_VARIANT_MERGED")


def save(host: ResourceHost, sess: LoraSession, directory: Path, *, training: bool) -> None:
    """Write `sess`'s trainer weights into `directory` (a training checkpoint adds the optimizer)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "format": FORMAT,
        "type": "training" if training else "inference",
        "mode": "lora" if sess.train else "full",
        "base_model": host.spec.name,
        "base_path": host.spec.path,
        "step": sess.step,
        "weights_version": sess.version if training else sess.step,
        "lora_config": sess.lora,
        "optimizer": None,
    }
    if sess.train:
        from peft.utils import get_peft_model_state_dict

        state = get_peft_model_state_dict(
            host.model, adapter_name=sess.train, save_embedding_layers=False
        )
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()},
                  str(directory / ADAPTER_FILES[0]))  # fmt: skip
        config = _copy_config(host.model.peft_config[sess.train], host.spec.name)
        config.save_pretrained(str(directory))
    else:
        host.base.save_pretrained(str(directory))
    if training and sess.optimizer is not None:
        tensors, meta["optimizer"] = _optimizer_state(sess.optimizer)
        save_file(tensors, str(directory / "optimizer.safetensors"))
    (directory / "meta.json").write_text(json.dumps(meta, indent=1))


def _copy_config(config: Any, base_name: str) -> Any:
    import copy

    config = copy.deepcopy(config)
    config.base_model_name_or_path = base_name
    config.inference_mode = True
    return config


def _optimizer_state(optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    tensors: dict[str, Any] = {}
    parts = []
    for pi, opt in enumerate(optimizer.parts):
        sd = opt.state_dict()
        scalars: dict[str, dict[str, Any]] = {}
        for idx, state in sd["state"].items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"{pi}.{idx}.{key}"] = value.detach().cpu().contiguous()
                else:
                    scalars.setdefault(str(idx), {})[key] = value
        groups = [
            {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()}
            for g in sd["param_groups"]
        ]
        parts.append({"param_groups": groups, "scalars": scalars})
    return tensors, {"kind": optimizer.kind, "parts": parts}


def read_meta(directory: Path) -> dict[str, Any]:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        raise RLInputError(
            "checkpoint", f"{directory.name} is not a readable checkpoint: {exc}"
        ) from None
    if meta.get("format") != FORMAT:
        raise RLInputError("checkpoint", f"unknown checkpoint format {meta.get('format')!r}")
    return meta


def load(host: ResourceHost, sid: str, directory: Path, *, load_optimizer: bool) -> None:
    """Load a TRAINING checkpoint into the open session `sid` (reopened with the checkpoint's
    LoRA config when it differs; the platform opens it with that config in the first place:
    `tgnb.emulator.rl.training.resumed_lora`), publish it, and restore the optimizer if asked."""
    import torch
    from safetensors.torch import load_file

    meta = read_meta(directory)
    if meta["type"] != "training":
        raise RLInputError("resume_from_checkpoint_id", "must be a TRAINING checkpoint")
    if (meta["mode"] == "lora") != host.lora_enabled:
        raise RLInputError(
            "resume_from_checkpoint_id",
            f"a {meta['mode']} checkpoint cannot resume on this "
            f"{'LoRA' if host.lora_enabled else 'full-weight'} resource",
        )
    sess = host.session(sid)
    if sess.train:
        from peft.utils import set_peft_model_state_dict

        if sess.lora != meta["lora_config"]:  # the platform opens it with the checkpoint's
            host.close_session(sid)
            host.open_session(sid, meta["lora_config"])
            sess = host.session(sid)
        state = load_file(str(directory / ADAPTER_FILES[0]), device=host.device)
        result = set_peft_model_state_dict(host.model, state, adapter_name=sess.train)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RLInputError(
                "resume_from_checkpoint_id", f"adapter keys do not match: {unexpected[:3]}"
            )
    else:
        state = {}
        for file in sorted(directory.glob("model*.safetensors")):
            state.update(load_file(str(file), device=host.device))
        missing, unexpected = host.base.load_state_dict(state, strict=False)
        tied = {k for k in missing if "lm_head" in k}
        if unexpected or set(missing) - tied:
            raise RLInputError(
                "resume_from_checkpoint_id", "the checkpoint's weights do not fit this model"
            )
    with torch.no_grad():
        for t, q in sess.pairs:
            q.copy_(t)
    sess.step = int(meta["step"])
    sess.version = sess.step
    sess.optimizer = None
    if load_optimizer and meta.get("optimizer"):
        _restore_optimizer(
            sess, meta["optimizer"], load_file(str(directory / "optimizer.safetensors"))
        )


def _restore_optimizer(sess: LoraSession, spec: dict[str, Any], tensors: dict[str, Any]) -> None:
    from tgnb.emulator.rl import optim

    sess.optimizer = optim.build(spec["kind"], sess.params)
    for pi, (opt, part) in enumerate(zip(sess.optimizer.parts, spec["parts"], strict=True)):
        state: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            p, idx, name = key.split(".", 2)
            if int(p) == pi:
                state.setdefault(int(idx), {})[name] = value
        for idx, scalars in part["scalars"].items():
            state.setdefault(int(idx), {}).update(scalars)
        groups = part["param_groups"]
        for g in groups:
            if "betas" in g:
                g["betas"] = tuple(g["betas"])
        opt.load_state_dict({"state": state, "param_groups": groups})


def export(directory: Path, variant: str, out: Path) -> list[Path]:
    """Write the ADAPTER or MERGED variant of the checkpoint in `directory` into `out`."""
    meta = read_meta(directory)
    if variant not in VARIANTS:
        raise RLInputError("variant", f"must be one of {', '.join(VARIANTS)}")
    out.mkdir(parents=True, exist_ok=True)
    if variant == "CHECKPOINT_VARIANT_ADAPTER":
        if meta["mode"] != "lora":
            raise RLInputError(
                "variant", "a full-weight checkpoint has no adapter; use CHECKPOINT_VARIANT_MERGED"
            )
        for name in ADAPTER_FILES:
            shutil.copy2(directory / name, out / name)
    else:
        _export_merged(directory, meta, out)
    return sorted(p for p in out.iterdir() if p.is_file())


def _export_merged(directory: Path, meta: dict[str, Any], out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = meta["base_path"] if meta["mode"] == "lora" else str(directory)
    model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if meta["mode"] == "lora":
        from peft import PeftModel

        head = model.get_output_embeddings()
        if head.weight is model.get_input_embeddings().weight:
            # an adapter on a tied unembedding must not change the embedding when merged
            head.weight = torch.nn.Parameter(head.weight.detach().clone())
            model.config.tie_word_embeddings = False
        from tgnb.emulator.rl.quiet import quiet_peft

        with quiet_peft():
            model = PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(meta["base_path"]).save_pretrained(str(out))
