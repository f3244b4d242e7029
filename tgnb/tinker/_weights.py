"""A sampler checkpoint's LoRA adapter in Tinker's layout, made from Post-Training's download.

Post-Training serves a LoRA checkpoint as PEFT writes it (``adapter_model.safetensors`` +
``adapter_config.json``): the output layer's LoRA (``train_unembed``) is keyed by the Hugging Face
module, ``base_model.model.lm_head.lora_A.weight``. Tinker names that layer ``unembed_tokens``,
``base_model.model.model.unembed_tokens.lora_A.weight`` (every other key is the same), and the
tools a Tinker user downloads weights for read Tinker's names: the cookbook's
``weights.build_hf_model`` and ``build_lora_adapter`` map ``model.unembed_tokens`` onto the
model's output layer, ``lm_head``, or, on a model with tied embeddings (Llama 3.2 1B/3B, the
built-in tiny model), the shared ``model.embed_tokens``; given ``lm_head`` on such a model they
stop ("mapped to 'lm_head.weight' which does not exist").

The translation is this layer's: Post-Training's own download (``tgnb.posttraining``, ``%tg pt``)
stays PEFT's format, which ``peft.PeftModel.from_pretrained`` loads as it is. It is done here,
on the client, because the API serves PEFT's files only, so it is the same against the service
and the emulator. Only the names change: the tensors' bytes are copied as they are (the
safetensors header is rewritten, nothing is loaded, no torch needed).

What the cookbook then builds: on a model whose output layer is its own (untied) the merged model
computes what the sampler computes (the LoRA at the output). On a tied model it adds the output
layer's delta to the one matrix both ends share, so the merged model's input embeddings move too
and it is not the sampler's model (the emulator, as PEFT, applies the LoRA at the output only);
the cookbook does the same with Tinker's own adapters. A base saved untied (``lm_head.weight``
stored, ``tie_word_embeddings`` false: the same model) merges exactly.
"""

from __future__ import annotations

import json
import shutil
import struct
import urllib.request
from pathlib import Path
from typing import BinaryIO

#: The output layer's LoRA: PEFT's key prefix (the HF module) and Tinker's.
PEFT_HEAD = "base_model.model.lm_head."
TINKER_HEAD = "base_model.model.model.unembed_tokens."
WEIGHTS, CONFIG = "adapter_model.safetensors", "adapter_config.json"


def tinker_key(key: str) -> str:
    """`key` of PEFT's adapter under Tinker's name (the output layer's LoRA renamed)."""
    return TINKER_HEAD + key.removeprefix(PEFT_HEAD) if key.startswith(PEFT_HEAD) else key


def fetch_in_tinker_layout(urls: dict[str, str], into: Path) -> dict[str, Path]:
    """Download the adapter files at `urls` (file name -> URL) into `into`, the weights' keys and
    the config's ``target_modules`` in Tinker's names; answers each file's local path."""
    into.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, url in urls.items():
        dest = into / Path(name).name
        part = dest.with_name(dest.name + ".part")  # a failed transfer leaves no file behind
        with urllib.request.urlopen(url) as src, part.open("wb") as sink:
            if name == WEIGHTS:
                _copy_renamed(src, sink)
            elif name == CONFIG:
                sink.write(_config(json.loads(src.read())))
            else:
                shutil.copyfileobj(src, sink)
        out[name] = part.replace(dest)
    return out


def _copy_renamed(src: BinaryIO, sink: BinaryIO) -> None:
    """A safetensors file from `src` to `sink` with its tensors renamed (`tinker_key`): the
    header (8 bytes little-endian length, then JSON) rewritten, the data copied unchanged (its
    offsets are relative to the data, so they stay right)."""
    (length,) = struct.unpack("<Q", src.read(8))
    header = json.loads(src.read(length))
    renamed = {k if k == "__metadata__" else tinker_key(k): v for k, v in header.items()}
    raw = json.dumps(renamed, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # padded to 8 bytes, as safetensors writes it
    sink.write(struct.pack("<Q", len(raw)) + raw)
    shutil.copyfileobj(src, sink)


def _config(config: dict[str, object]) -> bytes:
    modules = config.get("target_modules")
    if isinstance(modules, list):
        config["target_modules"] = ["unembed_tokens" if m == "lm_head" else m for m in modules]
    return json.dumps(config, indent=2).encode()
