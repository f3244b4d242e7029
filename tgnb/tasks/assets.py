"""The built-in offline model ``tiny``: a small Llama causal LM with a character-level tokenizer.

Nothing is downloaded. The model is built deterministically from a seed and materialized once,
atomically, into ``$TGNB_HOME/assets/tiny-<seed>-<fingerprint>/`` so that a path can be passed
wherever TRL wants one (the DPO reference model is loaded from the same path). The same code paths
then load a real Hugging Face model by id or a local directory on a cluster.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

from tgnb.config import default_home

TINY = "tiny"
#: The name the Post-Training API lists the tiny model under (the emulator's model catalogue).
TINY_NAME = "tgnb/tiny-llama"

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
#: Every character the tokenizer knows, one token each (no merges).
CHARSET = string.digits + string.ascii_letters + " +-*/=?:.,!'\"()[]{}<>#%&$@_;|\\^~`\n\t"

#: Shape of the tiny Llama; changing it changes the fingerprint, hence the cache directory.
TINY_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,  # the cookbook's loops need ≥ 2,048 (rl_loop: 369 tokens)
    "tie_word_embeddings": True,
}

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def vocab() -> dict[str, int]:
    """The tokenizer's vocabulary: special tokens first, then one id per character."""
    tokens = SPECIAL_TOKENS + list(dict.fromkeys(CHARSET))
    return {tok: i for i, tok in enumerate(tokens)}


def fingerprint() -> str:
    """A short hash of everything that determines the tiny assets (cache key)."""
    blob = json.dumps({"shape": TINY_SHAPE, "vocab": vocab(), "chat": CHAT_TEMPLATE, "v": 1})
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def build_tokenizer() -> Any:
    """A character-level `PreTrainedTokenizerFast` (BPE with an explicit vocab and no merges)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(vocab=vocab(), merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=TINY_SHAPE["max_position_embeddings"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(seed: int = 0) -> Any:
    """The tiny `LlamaForCausalLM` with random weights drawn from `seed` (same seed, same weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = vocab()
    config = LlamaConfig(
        vocab_size=len(ids),
        pad_token_id=ids[PAD],
        bos_token_id=ids[BOS],
        eos_token_id=ids[EOS],
        **TINY_SHAPE,
    )
    with torch.random.fork_rng(devices=[]):  # the CPU generator only; the caller's state is kept
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = ids[PAD]
    model.generation_config.eos_token_id = ids[EOS]
    model.generation_config.bos_token_id = ids[BOS]
    return model


def cache_dir(home: str | os.PathLike[str] | None = None) -> Path:
    return Path(home) if home is not None else default_home() / "assets"


def tiny_path(seed: int = 0, home: str | os.PathLike[str] | None = None) -> Path:
    """The directory of the tiny model for `seed`, built on first use (atomic: a finished directory
    is renamed into place, so a reader never sees a half-written one)."""
    root = cache_dir(home)
    target = root / f"tiny-{seed}-{fingerprint()}"
    if (target / "config.json").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        build_model(seed).save_pretrained(tmp)
        build_tokenizer().save_pretrained(tmp)
        if not (tmp / "config.json").is_file() or not any(tmp.glob("*.safetensors")):
            # transformers writes weights on rank 0 only once torch.distributed is up
            raise RuntimeError(
                "the tiny model was not written (torch.distributed already initialized on a rank "
                "other than 0?); call tgnb.tasks.assets.tiny_path() before the process group starts."
            )
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model(model: str, seed: int = 0) -> str:
    """What to hand to TRL for `model`: the tiny directory for ``tiny``, else the id or path as is."""
    return str(tiny_path(seed)) if model == TINY else model
