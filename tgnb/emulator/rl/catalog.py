"""What the Post-Training emulator can serve: the built-in tiny model and local causal-LM directories.

The built-in model (`tgnb.tasks.assets`, a tiny Llama with a character tokenizer) is listed by
``GET /v1/rl/supported-models`` under the absolute path of its directory: `materialize_tiny` writes
it into the local Hugging Face cache (``$HF_HUB_CACHE``, default ``$HF_HOME/hub``) in the hub's own
layout (``models--tgnb--tiny-llama/{refs/main,snapshots/<rev>/...}``) and the listed name is that
snapshot directory, the path ``snapshot_download`` would return. So a Tinker or TRL script that does
what their docs say, ``AutoTokenizer.from_pretrained(name)`` with the name from
``get_server_capabilities()`` or ``supported_models.get()``, makes a plain local load: no Hub
request, no retries without network, no environment variable, whatever the client's HF_HOME. (A
hub-style name cannot do that: huggingface_hub 2.x and transformers 5.x ask the Hub for the
revision and the repo's file list before they read the cache, unless ``HF_HUB_OFFLINE=1`` or
``local_files_only=True``; without network that is about a minute of retries, with network a 404.)
The revision is the assets' fingerprint, so the name is the same for every emulator on a machine
and across restarts, and changes only with the model.

The hub-style name ``tgnb/tiny-llama`` (`TINY_NAME`) stays accepted everywhere a base model is
(``pt.start("tgnb/tiny-llama")``, ``base_model=`` of the SDK and the Tinker layer) as an alias of
the same model; ``from_pretrained("tgnb/tiny-llama", local_files_only=True)`` loads it offline from
the same cache (the files it lacks are recorded as missing, ``.no_exist``). `same_model` treats
the two names as one model (a checkpoint taken under one resumes on a resource under the other).

A local directory holding a Hugging Face causal LM (``config.json`` + weights + tokenizer) is also a
valid ``base_model``: its name is its path. Directories listed by the daemon (``extra``) or in
``$TGNB_RL_MODELS`` (``os.pathsep``-separated) appear in `supported_models`; any other existing
directory with a ``config.json`` still resolves, and so does a hub id already in the local cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgnb.atomic import atomic_write
from tgnb.emulator.rl.inputs import MAX_BATCH_SIZE  # enforced per operation (inputs.batch)
from tgnb.tasks.assets import TINY_NAME

#: Files transformers looks for when loading a tokenizer or model by a hub name.
PROBED_MISSING = (
    "tokenizer.model",
    "added_tokens.json",
    "special_tokens_map.json",
    "chat_template.json",
    "processor_config.json",
    "preprocessor_config.json",
    "model.safetensors.index.json",
    "adapter_config.json",
)
EXTRA_ENV = "TGNB_RL_MODELS"
GPU_TYPE = "B200-SXM"
DEFAULT_MAX_LORA_RANK = 64
#: What a sample request gets when it omits num_samples / max_tokens (listed in supported-models).
SAMPLING_DEFAULTS: dict[str, Any] = {"logprobs": 1, "max_tokens": 64, "n": 1, "temperature": 1.0}


@dataclass(frozen=True)
class ModelSpec:
    """One servable base model: `name` is what the API shows, `path` the local directory loaded."""

    name: str
    path: str
    max_lora_rank: int
    full_weight: bool
    context_length: int


def _error(field: str, message: str) -> Exception:
    from tgnb.emulator.rl.inputs import RLInputError

    return RLInputError(field, message)


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache this process reads (honours HF_HUB_CACHE and HF_HOME)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = (
        os.environ.get("HF_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(home).expanduser() / "hub"


def materialize_tiny(cache: str | os.PathLike[str] | None = None) -> Path:
    """Write the built-in tiny model into the HF cache under `TINY_NAME`; return its snapshot dir.

    Idempotent and atomic: the snapshot is written beside its final name and renamed into place,
    then ``refs/main`` is replaced, so a concurrent reader sees either nothing or a whole model.
    The revision is derived from the assets' fingerprint (a new shape or vocab is a new revision).
    """
    from tgnb.tasks import assets

    root = Path(cache) if cache is not None else hf_hub_cache()
    repo = root / ("models--" + TINY_NAME.replace("/", "--"))
    revision = hashlib.sha1(f"tgnb-tiny-{assets.fingerprint()}".encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    if not (snapshot / "config.json").is_file():
        source = assets.tiny_path()
        (repo / "snapshots").mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{revision}.", dir=repo / "snapshots"))
        try:
            for item in source.iterdir():
                if item.is_file():
                    shutil.copy2(item, tmp / item.name)
            try:
                os.rename(tmp, snapshot)
            except OSError:
                if not (snapshot / "config.json").is_file():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    # the files `AutoTokenizer` / `AutoModel` probe that this model lacks, recorded as missing as
    # the Hub's cache does (``.no_exist/<rev>/<name>``): a load pinned to the revision or with
    # ``local_files_only`` then asks the Hub nothing at all
    missing = repo / ".no_exist" / revision
    for name in PROBED_MISSING:
        if not (snapshot / name).exists() and not (missing / name).exists():
            missing.mkdir(parents=True, exist_ok=True)
            (missing / name).touch()
    ref = repo / "refs" / "main"
    if not ref.is_file() or ref.read_text().strip() != revision:
        atomic_write(ref, revision)
    return snapshot


def _context_length(path: Path) -> int:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return 2048
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int):
            return int(config[key])
    return 2048


def _spec_for_dir(name: str, path: Path) -> ModelSpec:
    return ModelSpec(
        name=name,
        path=str(path),
        max_lora_rank=DEFAULT_MAX_LORA_RANK,
        full_weight=True,
        context_length=_context_length(path),
    )


def tiny_spec(name: str | None = None) -> ModelSpec:
    """The built-in model, named `name` (default: its directory, the name the emulator lists)."""
    snapshot = materialize_tiny()
    return _spec_for_dir(name or str(snapshot), snapshot)


def _extra_dirs(extra: Sequence[str]) -> list[str]:
    env = [p for p in os.environ.get(EXTRA_ENV, "").split(os.pathsep) if p.strip()]
    return list(dict.fromkeys([*extra, *env]))


def supported_models(extra: Sequence[str] = ()) -> list[ModelSpec]:
    """The built-in tiny model (named by its directory), then each listed local directory that
    holds a ``config.json``."""
    specs = [tiny_spec()]
    for item in _extra_dirs(extra):
        path = Path(item).expanduser()
        if (path / "config.json").is_file() and item != specs[0].name:
            specs.append(_spec_for_dir(item, path))
    return specs


def resolve(name: str, extra: Sequence[str] = ()) -> ModelSpec:
    """The spec of `name`: the tiny model (by its listed path or its alias `TINY_NAME`), a local
    directory, or a hub id in the local HF cache.

    Raises RLInputError("base_model", ...) naming what is served when nothing matches.
    """
    if not isinstance(name, str) or not name.strip():
        raise _error("base_model", "base_model must be a non-empty string, e.g. 'tgnb/tiny-llama'")
    if name == TINY_NAME:
        return tiny_spec(TINY_NAME)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return _spec_for_dir(name, path)
    if "/" in name and not name.startswith(("/", ".", "~")):
        cached = _cached_hub_snapshot(name)
        if cached is not None:
            return _spec_for_dir(name, cached)
    served = ", ".join(s.name for s in supported_models(extra))
    raise _error(
        "base_model",
        f"unknown base_model {name!r}: the emulator serves {served} (the built-in model also as "
        f"{TINY_NAME!r}), or a local Hugging Face causal-LM directory path",
    )


def same_model(a: str, b: str, extra: Sequence[str] = ()) -> bool:
    """Whether two base-model names are one model (the built-in model's path and its alias)."""
    from tgnb.emulator.rl.inputs import RLInputError

    if a == b:
        return True
    try:
        paths = {os.path.realpath(resolve(n, extra).path) for n in (a, b)}
    except RLInputError:  # a name that no longer resolves is only itself
        return False
    return len(paths) == 1


def _cached_hub_snapshot(name: str) -> Path | None:
    """A hub model already in the local HF cache (weights included), without any network call."""
    try:
        from huggingface_hub import snapshot_download

        found = Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached (or not a valid repo id): not servable
        return None
    has_weights = any(found.glob("*.safetensors")) or any(found.glob("*.bin"))
    return found if (found / "config.json").is_file() and has_weights else None


def _api_entry(spec: ModelSpec) -> dict[str, Any]:
    trainer: dict[str, Any] = {
        "lora": {
            "max_batch_size": MAX_BATCH_SIZE,
            "max_rank": spec.max_lora_rank,
            "max_seq_length": spec.context_length,
        }
    }
    if spec.full_weight:
        trainer["full"] = {"max_batch_size": MAX_BATCH_SIZE, "max_seq_length": spec.context_length}
    return {
        "base_model": spec.name,
        "default_gpu_type": GPU_TYPE,
        "compute_configs": [
            {
                "gpu_type": GPU_TYPE,
                "generator_config": {
                    "context_length": spec.context_length,
                    "sampling_defaults": dict(SAMPLING_DEFAULTS),
                },
                "trainer_config": trainer,
            }
        ],
    }


def supported_models_to_api(extra: Sequence[str] = ()) -> dict[str, Any]:
    """The body of ``GET /v1/rl/supported-models``: ``{"data": [RlSupportedModel, ...]}``."""
    return {"data": [_api_entry(spec) for spec in supported_models(extra)]}
