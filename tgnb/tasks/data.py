"""Training data: built-in procedurally generated sets, local JSONL/Parquet files, Hugging Face sets.

Built-in sets (no download, seeded, same rows for the same seed):

- ``arithmetic``: GSM8K-style questions ("What is 2+1? Answer:") with an ``answer`` column, for GRPO
  with the ``correctness`` and ``format`` rewards. Small operands (`MAX_OPERAND`) keep it
  learnable by ``tiny``; the generators take `max_operand` for harder sets.
- ``arithmetic-preference``: the same questions as DPO pairs, ``chosen`` the right answer and
  ``rejected`` a wrong one.
- ``arithmetic-sft``: the same questions for SFT, ``prompt`` and ``completion`` (the right answer).

What each algorithm reads (`REQUIRED_COLUMNS`): GRPO ``prompt`` (other columns reach the rewards
as keyword arguments); DPO ``prompt``, ``chosen``, ``rejected``; SFT ``messages`` (a chat: a list of
``{role, content}``) or ``prompt`` and ``completion`` (or ``text``).

Anything else goes through `datasets` exactly as on a cluster: a local ``.jsonl``/``.json``/
``.parquet`` file, or a Hugging Face dataset name (read from the local cache when offline).
"""

from __future__ import annotations

import difflib
import random
from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError

ARITHMETIC = "arithmetic"
PREFERENCE = "arithmetic-preference"
SFT = "arithmetic-sft"
BUILTIN = (ARITHMETIC, PREFERENCE, SFT)
#: The columns each algorithm needs: any one of the alternatives.
REQUIRED_COLUMNS: dict[str, tuple[tuple[str, ...], ...]] = {
    "grpo": (("prompt",),),
    "dpo": (("prompt", "chosen", "rejected"),),
    "sft": (("messages",), ("prompt", "completion"), ("text",)),
}
_BUILTIN_COLUMNS = {
    ARITHMETIC: ["prompt", "answer"],
    PREFERENCE: ["prompt", "chosen", "rejected"],
    SFT: ["prompt", "completion"],
}
#: Operands of the built-in questions lie in 0..MAX_OPERAND: small enough that the tiny model learns
#: to answer (not only to answer with a number) within about 100 GRPO steps on the CPU.
MAX_OPERAND = 2
LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _question(rng: random.Random, max_operand: int) -> tuple[str, int]:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    return f"What is {a}+{b}? Answer:", a + b


def arithmetic_rows(
    n: int = 2000, seed: int = 0, max_operand: int = MAX_OPERAND
) -> list[dict[str, Any]]:
    """`n` addition questions with operands in ``0..max_operand``: ``{prompt, answer}``."""
    rng = random.Random(f"arithmetic-{seed}")
    rows = []
    for _ in range(n):
        prompt, answer = _question(rng, max_operand)
        rows.append({"prompt": prompt, "answer": answer})
    return rows


def preference_rows(
    n: int = 2000, seed: int = 0, max_operand: int = MAX_OPERAND
) -> list[dict[str, Any]]:
    """`n` DPO pairs: ``{prompt, chosen, rejected}`` with the right and a wrong answer."""
    rng = random.Random(f"preference-{seed}")
    rows = []
    for _ in range(n):
        prompt, answer = _question(rng, max_operand)
        wrong = answer + rng.choice([-2, -1, 1, 2, 3])
        if wrong < 0:
            wrong = answer + 1
        rows.append({"prompt": prompt, "chosen": f" {answer}", "rejected": f" {wrong}"})
    return rows


def sft_rows(n: int = 2000, seed: int = 0, max_operand: int = MAX_OPERAND) -> list[dict[str, Any]]:
    """`n` SFT examples: ``{prompt, completion}`` with the right answer as the completion."""
    rng = random.Random(f"sft-{seed}")
    rows = []
    for _ in range(n):
        prompt, answer = _question(rng, max_operand)
        rows.append({"prompt": prompt, "completion": f" {answer}"})
    return rows


def columns(name: str, base: Path | None = None) -> list[str] | None:
    """The columns of a built-in set or of a local .jsonl/.json/.csv file (its first record, read
    here without `datasets`); None when they are not known without loading it (Parquet, Hub)."""
    if name in _BUILTIN_COLUMNS:
        return list(_BUILTIN_COLUMNS[name])
    if not _looks_local(name):
        return None
    path = resolve_path(name, base)
    _check_local(path)
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            if path.suffix == ".csv":
                import csv

                return next(csv.reader(fh), [])
            if path.suffix == ".json":
                text = fh.read(1 << 20)
                first = json.loads(text) if text.strip() else []
                first = first[0] if isinstance(first, list) and first else first
            else:
                line = next((ln for ln in fh if ln.strip()), "")
                first = json.loads(line) if line else {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TrainConfigError(
            f"dataset file '{name}' could not be read ({type(exc).__name__}): check it is "
            f"{path.suffix[1:].upper()} text"
        ) from None
    return list(first) if isinstance(first, dict) else None


def check_columns(name: str, algorithm: str, base: Path | None = None) -> list[str] | None:
    """Raise `TrainConfigError` when `name` lacks the columns `algorithm` reads; its columns."""
    cols = columns(name, base)
    need = REQUIRED_COLUMNS.get(algorithm)
    if cols is None or need is None:
        return cols
    if not any(set(option) <= set(cols) for option in need):
        want = " or ".join("+".join(option) for option in need)
        raise TrainConfigError(
            f"dataset '{name}' has columns {cols}; {algorithm.upper()} reads {want}: rename the "
            "columns, or choose another dataset"
        )
    return cols


def resolve_path(name: str, base: Path | None = None) -> Path:
    """A local dataset path: relative ones against `base` (the workdir), else as given."""
    path = Path(name).expanduser()
    return path if path.is_absolute() or base is None else base / path


def _check_local(path: Path) -> str:
    if path.suffix not in LOCAL_SUFFIXES:
        raise TrainConfigError(
            f"dataset file '{path}' has suffix '{path.suffix}'; use one of "
            f"{sorted(LOCAL_SUFFIXES)}."
        )
    if not path.is_file():
        raise TrainConfigError(f"dataset file '{path}' does not exist; check the path.")
    return LOCAL_SUFFIXES[path.suffix]


def columns_known_locally(name: str) -> bool:
    """Whether `name` is a local file path (not a built-in or a Hub name)."""
    return name not in BUILTIN and _looks_local(name)


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).suffix in LOCAL_SUFFIXES


def check(name: str, base: Path | None = None) -> None:
    """Raise `TrainConfigError` for a dataset that cannot be loaded (cheap checks only); a
    relative path is taken in `base` (the workdir; default the working directory)."""
    if name in BUILTIN:
        return
    if _looks_local(name):
        _check_local(resolve_path(name, base))
        return
    if "/" not in name:
        close = difflib.get_close_matches(name, BUILTIN, n=2)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise TrainConfigError(
            f"unknown dataset '{name}'.{hint} Use one of {list(BUILTIN)}, a .jsonl/.parquet file, "
            "or a Hugging Face dataset name such as 'owner/name'."
        )


def load(
    name: str,
    seed: int = 0,
    split: str = "train",
    size: int = 2000,
    config_name: str | None = None,
) -> Any:
    """The `split` of `name` as a `datasets.Dataset` (`size` rows for a built-in set)."""
    import datasets

    check(name)
    if name == ARITHMETIC:
        return datasets.Dataset.from_list(arithmetic_rows(size, seed))
    if name == PREFERENCE:
        return datasets.Dataset.from_list(preference_rows(size, seed))
    if name == SFT:
        return datasets.Dataset.from_list(sft_rows(size, seed))
    if _looks_local(name):
        path = Path(name).expanduser()
        builder = _check_local(path)
        return datasets.load_dataset(builder, data_files=str(path), split="train")  # one file
    try:
        return datasets.load_dataset(name, config_name, split=split)
    except Exception as exc:  # datasets raises many types for a missing or offline set
        raise TrainConfigError(
            f"dataset '{name}' could not be loaded ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
            "check the name, or pre-download it into the Hugging Face cache for offline use."
        ) from None
