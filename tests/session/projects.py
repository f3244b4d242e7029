"""The users' folders the session and certify tests launch from, copied into a test's tmp_path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: TRL's SFTTrainer quickstart plus ``tgnb.train.protect`` and a helper module of its own
USER_WORKDIR = Path(__file__).parent / "user_workdir"


def user_workdir(tmp_path: Path, rows: int = 400) -> Path:
    """A copy of the user's folder (script, its helper module) with a data file written in it."""
    wd = tmp_path / "project"
    shutil.copytree(USER_WORKDIR, wd, ignore=shutil.ignore_patterns("__pycache__"))
    with open(wd / "data.jsonl", "w", encoding="utf-8") as fh:
        for i in range(rows):
            fh.write(json.dumps({"a": i % 3, "b": (i // 3) % 3}) + "\n")
    return wd
