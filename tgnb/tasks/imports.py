"""A script's top-level imports, checked at launch against the environment the run gets.

`check` reads the script's syntax tree (nothing of it runs) and looks up each module it imports at
its top level -- outside functions, classes and ``try:`` blocks, which may guard an optional
import -- in the workdir the node gets (``name.py`` or a package folder ``name/``) and then in
this Python's installed packages (``importlib.util.find_spec`` on the top-level name: nothing is
imported). The local engine and Slurm run the script with this same Python, so a module found
nowhere would fail on the node, once per restart; a Kubernetes run's image is its own, and a
module installed only there is named here too (install it here as well, or import it inside
``main()``).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from tgnb.errors import TrainConfigError

__all__ = ["check", "top_level_imports"]


def top_level_imports(tree: ast.Module) -> list[tuple[str, int]]:
    """(top-level module name, line) for each absolute import at the script's top level, in
    order; imports under ``if`` at the top level count too (``if __name__ == ...``)."""
    found: list[tuple[str, int]] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend((a.name.split(".")[0], node.lineno) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((node.module.split(".")[0], node.lineno))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)

    visit(tree.body)
    return found


def _in_workdir(name: str, workdir: Path, script_dir: Path) -> bool:
    for base in {workdir, script_dir}:
        if (base / f"{name}.py").is_file() or (base / name).is_dir():
            return True
    return False


def _found(name: str, paths: Sequence[str]) -> bool:
    try:
        if paths and importlib.machinery.PathFinder.find_spec(name, list(paths)) is not None:
            return True
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check(script: str, source: bytes, workdir: Path, paths: Sequence[str] = ()) -> None:
    """Each top-level import of `script` (its `source`) is in `workdir`, in `paths` (the run's
    own ``PYTHONPATH``) or installed here; else a `TrainConfigError` naming the module, its line
    and the fix."""
    tree = ast.parse(source, filename=script)
    script_dir = (workdir / script).parent
    for name, line in top_level_imports(tree):
        if name == "__future__" or name in sys.builtin_module_names:
            continue
        if _in_workdir(name, workdir, script_dir):
            continue
        if not _found(name, paths):
            raise TrainConfigError(
                f"script {script!r} imports {name!r} (line {line}), which is neither in the "
                f"workdir nor installed where the run runs: pip install it (its package may "
                f"have another name) or put {name}.py in the workdir"
            )
