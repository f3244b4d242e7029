"""Imports go down the planes only, and no two modules of tgnb import each other.

Read from the source with `ast` (nothing is imported, so nothing is faked): every ``import`` and
``from ... import`` of a ``tgnb`` module anywhere in a file counts, at module level, inside a
function (a lazy import), or under ``if TYPE_CHECKING`` (a type is a dependency too).

The planes, top first (see /ARCHITECTURE.md: notebook -> session -> cloud/backends/posttraining ->
runs -> events/errors/config). A unit is a subpackage of ``tgnb`` (``tgnb/notebook/``) or a module
directly under it (``tgnb/session.py``); ``tgnb`` is the package's own ``__init__``. A unit may
import units of lower planes, and itself; never a unit of its own plane or of a plane above.

- ``cli``: the console entry point; dispatches by module name and reads ``tgnb.__version__``.
- ``tgnb`` (the package root: ``%load_ext tgnb``, ``tgnb.attach``) and ``server`` (the Jupyter
  server extension, which renders the notebook layer's views).
- ``notebook``: magics, widgets, timeline; typed on `Session` and `Run`.
- ``batch`` (papermill sweeps), ``demo`` and ``certify_cli`` (``tgnb certify``): scripts over a
  `Session`.
- ``session``: the attached cluster, its backend and the run store.
- ``backends`` (workload plane) and ``posttraining`` (managed plane).
- ``connection``: where the platform answers, Together or the local emulator (its peer), and the
  emulator-only operations; the one module of the product that starts, finds or talks to
  ``tgnb.emulator`` (with the local backend, which runs processes on its nodes: `EMULATOR_SEAMS`).
- ``cloud`` (control plane over the ``together`` SDK) and ``emulator`` (the platform's stand-in,
  served over HTTP; its admin client is used by the planes above).
- ``train``: the runtime on the node.
- ``tasks``: what a run trains and how (its config and checkpoint policy, the tiny model, data
  sets, rewards): checked by the session and the notebook, run by the runtime; the emulator's
  Post-Training engine and the Post-Training notebooks use the model, data and rewards.
- ``runs``: the domain types (`RunSpec`, `JobState`, `EXIT_PREEMPTED`), the `Backend` protocol and
  the run store; the backends and the training runtime depend on it, never the reverse.
- ``events``, ``errors`` (and ``progress``, text bars); ``markup`` (the one escaping function of
  every rendered string); then ``config``.

The emulator's own units (``tgnb.emulator.*``) may import each other; outside it, only
`EMULATOR_SEAMS` import it. ``cli`` dispatches ``tgnb emulator ...`` to ``tgnb.emulator.cli`` by
module name (the entry point, through importlib, not an import statement).

A new subpackage must be added to `LAYERS` before its imports are checked: the test says so. An
exception to the rule goes in `ALLOWED` (`ALLOWED_CYCLES` for a circle) with the
reason it is sound.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tgnb

PACKAGE = Path(tgnb.__file__).parent

#: The planes, top first. Extend here (a new subpackage goes where its imports say it belongs).
LAYERS: list[set[str]] = [
    {"cli"},
    {"tgnb", "server"},
    {"notebook"},
    {"batch", "demo", "sweep", "certify_cli"},  # sweep: a sweep's budget over its runs
    {"session"},
    {"certify"},  # a program beside an uninterrupted copy of itself, on the session's emulator
    {"prelaunch"},  # what Session.launch makes of its arguments, and the launch-time checks
    {"backends", "posttraining", "tinker"},  # tinker: the Tinker layer over Post-Training
    {"ptregistry"},  # the record of every Post-Training resource tgnb creates (issue 45)
    {"connection"},  # Together or the local emulator: the one way to the emulator (issue 25)
    {"cloud", "emulator"},
    {"train"},
    {"tasks"},
    {"runs"},
    {"prices"},  # dollars per GPU-hour of each node class, budgets
    {"preemption"},  # what Session.preempt did, as the notebook shows it
    {"events", "errors", "progress"},  # progress: text bars (tqdm), from the first-hour branch
    {"markup"},  # the one escaping function of every rendered string (issue 24)
    {"config"},
    {"atomic"},  # atomic_write: the one way a file is replaced (issue 32 §3)
]

#: (file relative to the package, imported module) -> why this import may go against the planes.
ALLOWED: dict[tuple[str, str], str] = {}

#: The only product code outside the emulator that imports it: the connection module, and the
#: local backend (a package), which runs processes on the emulator's nodes (issue 25).
EMULATOR_SEAMS = ("tgnb.connection", "tgnb.backends.local")

#: The modules of a circle (lazy imports that call each other back) -> why it is sound.
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ["tgnb", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _owner(name: str) -> str:
    """The longest prefix of `name` that is a tgnb module (``tgnb.events.Event`` -> tgnb.events)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str, source: str | None = None) -> list[tuple[str, int, bool]]:
    """(imported tgnb module, line, executed at run time) for every import in `module`'s file
    (or in `source`, read as that module's text)."""
    path = MODULES[module]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, typing_only)
            else:
                visit_stmt(child, typing_only)

    def visit_stmt(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((_owner(alias.name), node.lineno, not typing_only))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".")
                if path.name != "__init__.py":
                    pkg = pkg[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append(
                    (full if full in MODULES else _owner(base), node.lineno, not typing_only)
                )
        visit(node, typing_only)

    text = source if source is not None else path.read_text(encoding="utf-8")
    visit(ast.parse(text, str(path)), False)
    return [(m, line, run) for m, line, run in found if m == "tgnb" or m.startswith("tgnb.")]


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tgnb"


def plane(name: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if name in layer), None)


def test_every_unit_has_a_plane() -> None:
    missing = sorted({unit(m) for m in MODULES if plane(unit(m)) is None})
    assert not missing, (
        f"tgnb/{missing[0]} is on no plane: add it to LAYERS in tests/test_architecture.py, below "
        f"what it imports and above what imports it (unplaced: {', '.join(missing)})"
    )


def test_imports_go_down_the_planes() -> None:
    wrong = []
    for module, path in MODULES.items():
        src = unit(module)
        for target, line, _ in imports(module):
            dst = unit(target)
            if dst == src or plane(src) is None or plane(dst) is None:
                continue
            rel = str(path.relative_to(PACKAGE))
            if (rel, target) in ALLOWED:
                continue
            if plane(dst) <= plane(src):  # type: ignore[operator]
                same = plane(dst) == plane(src)
                why = "of the same plane" if same else "of a plane above"
                wrong.append(f"tgnb/{rel}:{line} imports {target} ({dst} is {why} {src})")
    assert not wrong, "imports against the planes (move the code down, or see ALLOWED):\n" + (
        "\n".join(dict.fromkeys(wrong))
    )


def _seam(module: str) -> bool:
    return any(module == s or module.startswith(s + ".") for s in EMULATOR_SEAMS)


def emulator_imports(module: str, source: str | None = None) -> list[str]:
    """Where `module` (or `source`, read as its text) imports tgnb.emulator against the rule."""
    if module == "tgnb.emulator" or module.startswith("tgnb.emulator.") or _seam(module):
        return []
    rel = str(MODULES[module].relative_to(PACKAGE))
    return [
        f"tgnb/{rel}:{line} imports {target}"
        for target, line, _ in imports(module, source)
        if (target == "tgnb.emulator" or target.startswith("tgnb.emulator."))
        and (rel, target) not in ALLOWED
    ]


def test_the_control_plane_reads_the_run_contract_not_the_tasks() -> None:
    """The run's contract (`tgnb.runs.spec`, `tgnb.runs.policy`) lies below the planes: the
    control plane reads it there and imports nothing of what a run trains (`tgnb.tasks`)."""
    wrong = [
        f"{module} imports {target} (line {line})"
        for module in MODULES
        if module == "tgnb.cloud" or module.startswith("tgnb.cloud.")
        for target, line, _ in imports(module)
        if target == "tgnb.tasks" or target.startswith("tgnb.tasks.")
    ]
    assert wrong == []


def test_only_the_connection_and_the_local_backend_import_the_emulator() -> None:
    """The emulator is a peer of the Together API, not a mode of the product (ARCHITECTURE.md):
    the rest of the product reaches it through `tgnb.connection` (its `Endpoint.emulator`)."""
    wrong = [w for module in MODULES for w in emulator_imports(module)]
    assert not wrong, (
        "only tgnb/connection.py and tgnb/backends/local/ may import tgnb.emulator (go through "
        "tgnb.connection, or move a shared constant down to tgnb/config.py or tgnb/tasks/):\n"
        + "\n".join(wrong)
    )


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_module_imports_back() -> None:
    """No cycle between modules through imports that run (lazy ones included); an import under
    ``TYPE_CHECKING`` never runs, so it cannot close a circle."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _, runs in imports(module):
            if runs and target != module and target in MODULES:
                edges[module].add(target)
    cycles = [c for c in _cycles(edges) if frozenset(c) not in ALLOWED_CYCLES]
    assert not cycles, "modules that import each other: " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def unit_cycles() -> list[list[str]]:
    """Circles between units (``tgnb.certify`` -> ``tgnb.session`` -> ``tgnb.certify``) through
    imports that run, whatever `ALLOWED` excuses against the planes."""
    edges: dict[str, set[str]] = {}
    for module in MODULES:
        for target, _, runs in imports(module):
            if runs and unit(target) != unit(module):
                edges.setdefault(unit(module), set()).add(unit(target))
    return _cycles(edges)


def test_no_package_imports_back() -> None:
    """No two units import each other, even lazily: a package is one layer, whole."""
    assert unit_cycles() == [], "packages that import each other (move the code to one side)"


#: The training runtime's framework adapters (they import transformers or Lightning), and the
#: entry points that pick one; the guard's own modules (`preemption`, `checkpoint`, `dcpio`, ...)
#: are below them and never reach up to one.
TRAIN_ADAPTERS = {"tgnb.train.callback", "tgnb.train.metrics", "tgnb.train.lightning"}
TRAIN_ENTRIES = {"tgnb.train.protect", "tgnb.train.runner", "tgnb.train.validate"}


def test_the_guard_does_not_import_its_framework_adapters() -> None:
    wrong = [
        f"{module}:{line} imports {target}"
        for module in MODULES
        if module.startswith("tgnb.train.") and module not in TRAIN_ADAPTERS | TRAIN_ENTRIES
        for target, line, _ in imports(module)
        if target in TRAIN_ADAPTERS
    ]
    assert wrong == [], "the guard reaches up to an adapter (the entry point builds it):\n" + (
        "\n".join(wrong)
    )


def test_the_checks_can_fail() -> None:
    """The rule itself: lazy, relative and type-only imports are seen, and a circle is found."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import timeline\n"
        "from ..events import Event\n"
        "if TYPE_CHECKING:\n"
        "    from tgnb.session import Session\n"
        "def f():\n"
        "    from tgnb.backends import local\n"
        "    import tgnb.cloud.cluster\n"
    )
    assert imports("tgnb.notebook._svg", source) == [
        ("tgnb.notebook.timeline", 2, True),
        ("tgnb.events", 3, True),
        ("tgnb.session", 5, False),
        ("tgnb.backends.local", 7, True),
        ("tgnb.cloud.cluster", 8, True),
    ]
    assert plane("notebook") < plane("session") < plane("backends") < plane("runs")  # type: ignore[operator]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    lazy = "def f():\n    from tgnb.emulator.admin import AdminClient\n"
    assert emulator_imports("tgnb.session", lazy) == [
        "tgnb/session.py:2 imports tgnb.emulator.admin"
    ]
    assert emulator_imports("tgnb.posttraining.resource", "from tgnb import emulator\n") == [
        "tgnb/posttraining/resource.py:1 imports tgnb.emulator"
    ]
    assert emulator_imports("tgnb.connection", lazy) == []
    assert emulator_imports("tgnb.backends.local.backend", lazy) == []
    assert plane("posttraining") < plane("connection") < plane("cloud")  # type: ignore[operator]


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_uses(module: str, source: str | None = None) -> list[str]:
    """Where `module` (or `source`, read as its text) uses another module's private name: imports
    ``_name`` from another module, reads ``mod._name`` of a tgnb module it imported, or imports
    from a private module (``tgnb.posttraining._connect``) outside that module's package."""
    path = MODULES[module]
    rel = str(path.relative_to(PACKAGE))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    found: list[str] = []
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update(a.asname or a.name for a in node.names if a.name.startswith("tgnb"))
        if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
            continue
        if not node.module.startswith("tgnb"):
            continue
        parts = node.module.split(".")
        hidden = [i for i, p in enumerate(parts) if _private(p)]
        if hidden and not package.startswith(".".join(parts[: hidden[0]])):
            found.append(f"tgnb/{rel}:{node.lineno} imports the private module {node.module}")
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            if _private(alias.name) and not (sub in MODULES and node.module == package):
                found.append(f"tgnb/{rel}:{node.lineno} imports {node.module}.{alias.name}")
            if sub in MODULES:
                aliases.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in aliases:
                found.append(f"tgnb/{rel}:{node.lineno} reads {base.id}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    """A name another module needs is public (httpx's style): private names stay in their
    module, private modules in their package."""
    wrong = [w for module in MODULES for w in private_uses(module)]
    assert not wrong, "private names used across modules (make them public):\n" + "\n".join(wrong)


def test_the_private_name_check_can_fail() -> None:
    assert private_uses("tgnb.notebook.timeline", "from tgnb.events import _x\n") == [
        "tgnb/notebook/timeline.py:1 imports tgnb.events._x"
    ]
    assert private_uses("tgnb.session", "from tgnb.posttraining._connect import connect\n") == [
        "tgnb/session.py:1 imports the private module tgnb.posttraining._connect"
    ]
    assert private_uses("tgnb.session", "from tgnb import config\nconfig._SECRETS\n") == [
        "tgnb/session.py:2 reads config._SECRETS"
    ]
    inside = "from tgnb.posttraining import _connect\nfrom tgnb.posttraining._connect import c\n"
    assert private_uses("tgnb.posttraining.resource", inside) == []


#: The most lines a module of the package may have (issue 49 §4): a module read top to bottom.
MAX_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by what they do): {long}"
