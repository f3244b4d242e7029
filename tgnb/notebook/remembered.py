"""The runs a notebook launched or opened, kept in the tgnb home so that ``%tg runs`` and
``%tg cost`` list them again after a kernel restart (or a new kernel for the same notebook).

A notebook is known by the path the Jupyter server gives its kernel's session
(``JPY_SESSION_NAME``, which ipykernel also sets as ``__session__``) or VS Code's
``__vsc_ipynb_file__``. Where neither is set (a plain IPython, papermill's kernel) the runs are
remembered in the kernel only, as before. Each notebook has one small file,
``<home>/notebooks/<hash of its path>.json``: ``{"notebook": path, "runs": [run ids, in order]}``,
written whole (`tgnb.atomic.atomic_write`); a file that cannot be read counts as none.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Most run ids kept for one notebook (the oldest go first).
MAX_RUNS = 1000
FOLDER = "notebooks"


def notebook_key(user_ns: Mapping[str, Any] | None) -> str | None:
    """The notebook's path as its kernel knows it, or None (no notebook known)."""
    ns = user_ns or {}
    for value in (ns.get("__vsc_ipynb_file__"), ns.get("__session__")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    name = os.environ.get("JPY_SESSION_NAME", "").strip()
    return name or None


def _path(home: Path, key: str) -> Path:
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return Path(home) / FOLDER / f"{digest}.json"


def load(home: Path, key: str) -> list[str]:
    """The run ids remembered for notebook `key` ([] when none, or unreadable)."""
    try:
        data = json.loads(_path(home, key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("notebook") != key:
        return []
    runs = data.get("runs")
    return [r for r in runs if isinstance(r, str)] if isinstance(runs, list) else []


def save(home: Path, key: str, run_ids: list[str]) -> None:
    """Remember `run_ids` (in order) for notebook `key`; a failure to write is not the user's
    cell's failure (the kernel still remembers them)."""
    from tgnb.atomic import atomic_write

    path = _path(home, key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"notebook": key, "runs": list(dict.fromkeys(run_ids))[-MAX_RUNS:]}
        atomic_write(path, json.dumps(body, indent=1))


__all__ = ["FOLDER", "MAX_RUNS", "load", "notebook_key", "save"]
