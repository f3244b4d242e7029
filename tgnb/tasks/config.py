"""The configuration of a training run: one dataclass (`tgnb.runs.trainconfig.TrainConfig`, part of
the run's contract, re-exported here), loaded from YAML plus ``--set`` overrides, and its checks.

A config file looks like::

    algorithm: grpo            # grpo | dpo | sft, or script (the user's own program)
    model: tiny                # built-in tiny, a Hugging Face id, or a local directory
    dataset: arithmetic        # built-in name, a .jsonl/.parquet/.csv file, or a Hugging Face dataset
    # dataset_config: main     # a Hugging Face dataset's configuration; dataset_split: train
    rewards: [correctness, format]   # GRPO only: built-in names or package.module:function
    max_steps: 100
    seed: 0
    trl: {learning_rate: 5.0e-3, num_generations: 8}   # passed through to GRPOConfig / DPOConfig
    lora: {r: 8, lora_alpha: 16}                        # optional, becomes a peft LoraConfig
    checkpoint: {every_steps: 50, keep_last: 2}         # a tgnb.runs.policy.CheckpointPolicy

A run of the user's own code names a script (a path inside the workdir, run as ``__main__`` with
``args``) or a command (run as it is, in the workdir)::

    algorithm: script
    script: train.py
    args: [--lr, "1e-4"]
    # command: [accelerate, launch, train.py]
    checkpoint: {auto: true}   # what tgnb.train.protect / Checkpointer use in that program

``--set trl.learning_rate=1e-3`` overrides one dotted key; the value is read as YAML.
Every unknown key is a `TrainConfigError` that names the close matches; nothing is dropped.
`check_light` checks the rest that needs neither torch nor TRL (the session runs it before a run is
recorded); the checks that need TRL or the run directory are `tgnb.train.validate`'s, on the node.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tgnb.errors import TrainConfigError
from tgnb.runs.node import YAML_FLOAT
from tgnb.runs.policy import MAX_STEPS, bounded

# The config itself is part of the run's contract, below this plane: re-exported from here.
from tgnb.runs.trainconfig import ALGORITHMS as ALGORITHMS
from tgnb.runs.trainconfig import DEFAULT_DATASET as DEFAULT_DATASET
from tgnb.runs.trainconfig import DEFAULT_REWARDS as DEFAULT_REWARDS
from tgnb.runs.trainconfig import KINDS as KINDS
from tgnb.runs.trainconfig import SCRIPT as SCRIPT
from tgnb.runs.trainconfig import TrainConfig as TrainConfig
from tgnb.runs.trainconfig import field_names as field_names
from tgnb.runs.trainconfig import from_dict as from_dict
from tgnb.runs.trainconfig import unknown as unknown
from tgnb.runs.workdir import provides

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML reads it, except that ``1e-3`` is a float (not the string "1e-3")."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, list("-+0123456789."))


#: Longest YAML text tgnb reads as a run's config or a value (characters).
MAX_YAML_CHARS = 1_000_000


class YAMLAliasError(yaml.composer.ComposerError):
    """An anchor (``&name``) or alias (``*name``) in YAML tgnb reads: refused, so a few hundred
    bytes cannot expand into gigabytes (the "billion laughs")."""


class _PlainLoader(_Loader):
    """`_Loader` without anchors, aliases or merge keys: each node is written out once."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise YAMLAliasError(
                None,
                None,
                "YAML anchors and aliases (&name, *name, <<: *name) are not accepted: "
                "write each value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


#: Keys whose lists reach a program as its command line: their items are read as the text written
#: (``args: [--tag, 007, --lr, 3.0e-4]`` gives ``"007"`` and ``"3.0e-4"``, not 7 and 0.0003).
ARGV_KEYS = ("args", "command")


def _as_written(node: yaml.Node, argv: bool) -> None:
    """The plain scalars of the argument lists in `node` (the document's `ARGV_KEYS`, or, with
    `argv`, the document itself when it is a list) tagged as strings: read as written."""
    lists: list[yaml.Node] = []
    if argv and isinstance(node, yaml.SequenceNode):
        lists.append(node)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value in ARGV_KEYS:
                lists.append(value)
    for found in lists:
        for item in found.value if isinstance(found, yaml.SequenceNode) else ():
            if isinstance(item, yaml.ScalarNode) and item.style is None and item.value:
                item.tag = "tag:yaml.org,2002:str"


def load_yaml(text: str, *, argv: bool = False) -> Any:
    """The one reader of YAML that tgnb takes from users (config files, ``--set`` values, the
    ``%%tg launch`` body, papermill parameters): safe tags only, ``1e-3`` a float, no anchors or
    aliases, at most `MAX_YAML_CHARS` characters and no deeper than Python's recursion allows.
    The items of an ``args`` or ``command`` list are the text written (`ARGV_KEYS`); with `argv`,
    so are those of a document that is itself a list (``--set args=[--tag, 007]``).
    Raises `yaml.YAMLError` (`YAMLAliasError` for an alias) for what it refuses."""
    if len(text) > MAX_YAML_CHARS:
        raise yaml.YAMLError(
            f"the YAML is {len(text):,} characters; at most {MAX_YAML_CHARS:,} are read"
        )
    loader = _PlainLoader(text)  # a SafeLoader subclass
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _as_written(node, argv)
        return loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError("the YAML is nested too deeply: flatten it") from None
    finally:
        loader.dispose()


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value read as YAML)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise TrainConfigError(
            f"override '{item}' is not key=value; write e.g. --set max_steps=50."
        )
    argv = key.strip().rpartition(".")[2] in ARGV_KEYS  # ``args=[--tag, 007]``: as written
    try:
        value = load_yaml(text, argv=argv) if text.strip() else ""
    except YAMLAliasError:
        raise TrainConfigError(
            f"override '{key.strip()}': YAML anchors and aliases (&name, *name) are not "
            "accepted; write the value out"
        ) from None
    except yaml.YAMLError:
        value = text
    return key.strip().split("."), value


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """`raw` with each dotted ``key=value`` set (nested mappings created as needed)."""
    for item in overrides:
        path, value = parse_override(item)
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise TrainConfigError(f"override '{item}': '{part}' is not a mapping.")
            node = child
        node[path[-1]] = value
    return raw


def load(
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
) -> TrainConfig:
    """A `TrainConfig` from a YAML file (or none), dotted overrides and an optional run directory."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise TrainConfigError(f"config file '{p}' does not exist; check the path.")
        try:
            loaded = load_yaml(p.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TrainConfigError(f"config file '{p}' is not valid YAML ({first}).") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise TrainConfigError(f"config file '{p}' must hold a mapping of keys to values.")
        raw = loaded or {}
    raw = apply_overrides(raw, overrides)
    if run_dir is not None:
        raw["run_dir"] = str(run_dir)
    return from_dict(raw)


# -- checks that need neither torch nor TRL ------------------------------------------------------
#: A model directory holds one of these (a model's ``save_pretrained``, or a PEFT adapter's).
MODEL_FILES = ("config.json", "adapter_config.json")


def check_model(model: str) -> None:
    """``tiny``, an existing local directory, or something shaped like a Hugging Face id."""
    if model == "tiny":
        return
    p = Path(model).expanduser()
    if model.startswith((".", "/", "~")) or p.exists():
        if not p.is_dir():
            raise TrainConfigError(
                f"model path '{model}' does not exist; give an existing model directory, "
                "a Hugging Face id, or 'tiny'."
            )
        if not any((p / name).is_file() for name in MODEL_FILES):
            raise TrainConfigError(
                f"model path '{model}' is a directory with no model in it (no config.json): give "
                "a model directory (one save_pretrained wrote), a Hugging Face id, or 'tiny'."
            )
        return
    if not _HF_ID.fullmatch(model):
        raise TrainConfigError(
            f"model '{model}' is neither 'tiny', an existing directory, nor a Hugging Face id."
        )


#: Upper bounds of the integer settings (a step count past them is a typo, not a plan).
MAX_SEED, MAX_DATASET_SIZE, MAX_LORA_RANK = 2**32 - 1, 100_000_000, 4096
_REWARD_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or not value.isprintable() or len(value) > 512:
        raise TrainConfigError(f"{name} must be a printable string, not {value!r:.60}.")


def _check_reward(name: Any, workdir: Path | None = None) -> None:
    """A built-in reward, or ``package.module:function`` whose module exists; a module already
    imported (the standard library, the reward's own) is resolved and its signature checked."""
    import importlib.util
    import sys

    from tgnb.tasks import rewards

    _text("a reward", name)
    if name in rewards.BUILTIN or ":" not in name:
        rewards.resolve(name)  # a built-in, or the unknown-name error with its close matches
        return
    if not _REWARD_PATH.fullmatch(name):
        raise TrainConfigError(f"reward {name!r:.60} is not 'package.module:function'.")
    module = name.partition(":")[0]
    top = module.split(".")[0]
    if provides(workdir or Path.cwd(), top):
        return  # the workdir's own module: imported where the run is checked (tgnb.prelaunch)
    if top in sys.modules or importlib.util.find_spec(top) is None:
        rewards.resolve(name)  # cheap here: imported already, or the import error at once


def _check_program(cfg: TrainConfig) -> None:
    """A script run: `script` (a relative path) or `command`, not both, with string arguments."""
    if cfg.algorithm != SCRIPT:
        raise TrainConfigError(
            f"'script' and 'command' make a run of your own program: set algorithm: script, "
            f"not {cfg.algorithm!r:.20}."
        )
    if (cfg.script is None) == (cfg.command is None):
        raise TrainConfigError(
            "a script run needs exactly one of 'script' (e.g. train.py) or 'command' "
            "(e.g. [accelerate, launch, train.py])."
        )
    if cfg.script is not None:
        _text("script", cfg.script)
        if Path(cfg.script).is_absolute() or ".." in Path(cfg.script).parts:
            raise TrainConfigError(
                f"script {cfg.script!r:.60} must be a path inside the workdir, such as train.py."
            )
    words = cfg.command if cfg.command is not None else cfg.args
    what = "command" if cfg.command is not None else "args"
    if not isinstance(words, list) or (cfg.command is not None and not words):
        raise TrainConfigError(f"'{what}' must be a list of strings such as ['--lr', '1e-4'].")
    for word in [*words, *(cfg.args if cfg.command is not None else [])]:
        if not isinstance(word, str) or "\0" in word or len(word) > 4096:
            raise TrainConfigError(f"'{what}' must hold strings only, not {word!r:.40}.")
    if cfg.command is not None and cfg.args:
        raise TrainConfigError("'args' go with 'script'; put a command's arguments in 'command'.")
    bounded("seed", cfg.seed, 0, MAX_SEED)
    for key in ("name", "run_dir"):
        if getattr(cfg, key) is not None:
            _text(key, getattr(cfg, key))


def check_script(cfg: TrainConfig, workdir: Path, paths: Sequence[str] = ()) -> None:
    """The script exists in `workdir`, compiles, and its top-level imports are found there or
    installed or in `paths` (the run's ``PYTHONPATH``; `tgnb.tasks.imports`; nothing of it is
    run or imported)."""
    if cfg.script is None:
        return
    path = workdir / cfg.script
    if not path.is_file():
        raise TrainConfigError(
            f"script {cfg.script!r} is not in the workdir {workdir}: give a path inside it"
        )
    source = path.read_bytes()
    try:
        compile(source, str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise TrainConfigError(
            f"script {cfg.script!r} does not compile: {exc.msg} (line {exc.lineno})"
        ) from None
    except ValueError as exc:
        raise TrainConfigError(f"script {cfg.script!r} does not compile: {exc}") from None
    from tgnb.tasks import imports

    imports.check(cfg.script, source, workdir, paths)  # each top-level import is on the node


def check_light(cfg: TrainConfig, workdir: Path | None = None) -> None:
    """The checks that need neither torch nor TRL: types, ranges, model, dataset and rewards.
    `Session.launch` runs them before it records anything; `validate` runs them first. Relative
    dataset paths are taken in `workdir` (default: the working directory)."""
    from tgnb.tasks import data

    if not isinstance(cfg.algorithm, str) or cfg.algorithm not in KINDS:
        raise unknown("algorithm", str(cfg.algorithm)[:40], KINDS)
    if cfg.algorithm == SCRIPT or cfg.script is not None or cfg.command is not None:
        _check_program(cfg)
        return
    bounded("max_steps", cfg.max_steps, 1, MAX_STEPS)
    bounded("seed", cfg.seed, 0, MAX_SEED)
    bounded("dataset_size", cfg.dataset_size, 1, MAX_DATASET_SIZE)
    _text("model", cfg.model)
    check_model(cfg.model)
    _text("dataset", cfg.dataset)
    assert cfg.dataset is not None
    data.check(cfg.dataset, workdir)
    data.check_columns(cfg.dataset, cfg.algorithm, workdir)
    _text("dataset_split", cfg.dataset_split)
    for key in ("name", "run_dir", "dataset_config"):
        if getattr(cfg, key) is not None:
            _text(key, getattr(cfg, key))
    if not isinstance(cfg.rewards, list):
        raise TrainConfigError("rewards must be a list such as [correctness, format].")
    if cfg.algorithm == "grpo":
        if not cfg.rewards:
            raise TrainConfigError("GRPO needs at least one reward; set rewards: [correctness].")
        for reward in cfg.rewards:
            _check_reward(reward, workdir)
    if cfg.lora is not None:
        check_lora(cfg.lora)
    for key in ("max_steps", "seed"):
        if key in cfg.trl:
            raise TrainConfigError(f"set {key} at the top level of the config, not under trl.")
    _check_finite("trl", cfg.trl)
    check_ranges(cfg.trl)


def _check_finite(where: str, value: Any) -> None:
    """Every number in `value` (mappings and lists walked, ``trl.a.b[0]``) is finite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise TrainConfigError(f"{where} must be a finite number, not {value}.")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _check_finite(f"{where}.{key}", item)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_finite(f"{where}[{i}]", item)


def check_lora(lora: Any) -> None:
    """A LoRA config peft and torch take: ``r`` a whole number from 1, ``lora_alpha`` above 0,
    ``lora_dropout`` in [0, 1) (peft and ``nn.Dropout`` refuse the others on the node, at every
    restart)."""
    if not isinstance(lora, Mapping):
        raise TrainConfigError("'lora' must be a mapping such as {r: 8, lora_alpha: 16}.")
    _check_finite("lora", dict(lora))
    if "r" in lora:
        bounded("lora.r", lora["r"], 1, MAX_LORA_RANK)
    alpha = lora.get("lora_alpha")
    if alpha is not None and not (_real(alpha) and alpha > 0):
        raise TrainConfigError(
            f"lora.lora_alpha must be a number above 0, not {alpha!r:.40}: e.g. 16."
        )
    drop = lora.get("lora_dropout")
    if drop is not None and not (_real(drop) and 0 <= drop < 1):
        raise TrainConfigError(
            f"lora.lora_dropout must be a number in [0, 1), not {drop!r:.40}: e.g. 0.05."
        )


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


#: Sensible ranges of common TRL/transformers options: (low, high, low allowed, high allowed).
#: A value outside is a typo or a unit slip (``--lr 1e308``), refused before anything runs.
TRL_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "learning_rate": (0.0, 1.0, False, True),
    "weight_decay": (0.0, 10.0, True, True),
    "warmup_ratio": (0.0, 1.0, True, True),
    "warmup_steps": (0, 10_000_000, True, True),
    "max_grad_norm": (0.0, 1e6, True, True),
    "adam_beta1": (0.0, 1.0, True, False),
    "adam_beta2": (0.0, 1.0, True, False),
    "adam_epsilon": (0.0, 1.0, False, True),
    "num_train_epochs": (0.0, 1e6, False, True),
    "per_device_train_batch_size": (1, 1_000_000, True, True),
    "gradient_accumulation_steps": (1, 1_000_000, True, True),
    "logging_steps": (0, 10_000_000, False, True),
    "num_generations": (2, 100_000, True, True),
    "max_completion_length": (1, 10_000_000, True, True),
    "max_prompt_length": (1, 10_000_000, True, True),
    "max_length": (1, 10_000_000, True, True),
    "temperature": (0.0, 100.0, False, True),
    "top_p": (0.0, 1.0, False, True),
    "beta": (0.0, 1e6, True, True),
    "epsilon": (0.0, 10.0, False, True),
}


def check_ranges(trl: Mapping[str, Any]) -> None:
    """Each option of `TRL_RANGES` given in `trl` is a number in its range."""
    for key, value in trl.items():
        bounds = TRL_RANGES.get(str(key))
        if bounds is None:
            continue
        low, high, low_ok, high_ok = bounds
        number = isinstance(value, int | float) and not isinstance(value, bool)
        above = number and (value > low or (low_ok and value == low))
        below = number and (value < high or (high_ok and value == high))
        if not (above and below and math.isfinite(value)):
            lo, hi = ("[" if low_ok else "("), ("]" if high_ok else ")")
            raise TrainConfigError(
                f"trl.{key} must be a number in {lo}{low:g}, {high:g}{hi}, not {value!r:.40}."
            )
