"""The subcommands of ``%tg``, one module each, in one table the `tgnb.notebook.magics.Tg` router
reads (``%tg pt ...`` too: its subcommands are rows ``"pt NAME"`` of the same table).

A row names the subcommand, its module (imported on the subcommand's first use, so ``%load_ext
tgnb`` and ``%tg --help`` import none of them) and its one help line (shown by ``%tg --help`` and as
the parser's description). The module does one call on the Python API:

- ``arguments(parser)``: its options, on a `grammar.Parser` (``%tg NAME --help`` shows them);
- ``run(tg, args, cell)``: the call, on the `Tg` magics' state (the attached session, the runs of
  this notebook, the Post-Training connection) — a bad line is a `UsageError` naming the fix;
- optionally ``USAGE`` (the usage line), ``CELL = True`` (it takes a ``%%tg`` cell body and the
  words after ``--`` on the line), ``STORES = True`` (its ``-o NAME`` stores into the namespace).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

from tgnb.notebook.commands.grammar import Parser


@dataclass
class Command:
    """One row of the table: a subcommand's name (``"status"``, ``"pt start"``), the module that
    does it (a path under `tgnb.notebook.commands`, imported on first use) and its help line."""

    name: str
    path: str
    help: str
    _parser: Parser | None = field(default=None, repr=False)

    @property
    def module(self) -> ModuleType:
        """The subcommand's module, imported on first use."""
        return importlib.import_module(f"{__name__}.{self.path}")

    @property
    def takes_cell(self) -> bool:
        return bool(getattr(self.module, "CELL", False))

    @property
    def stores(self) -> bool:
        return bool(getattr(self.module, "STORES", False))

    @property
    def parser(self) -> Parser:
        """Its parser, built on first use."""
        if self._parser is None:
            usage = getattr(self.module, "USAGE", None)
            parser = Parser(prog=f"%tg {self.name}", description=self.help, usage=usage)
            self.module.arguments(parser)
            self._parser = parser
        return self._parser


#: Groups of subcommands (``%tg pt NAME``): the group's help line in ``%tg --help``.
GROUPS = {"pt": "Post-Training: models, resources, sessions, checkpoints, cost, panel."}

#: (subcommand, module under tgnb.notebook.commands, help line), in the order ``--help`` lists them.
_ROWS: list[tuple[str, str, str]] = [
    (
        "attach",
        "attach",
        "Attach this notebook to a cluster (by name or id), or to the local emulator.",
    ),
    ("clusters", "clusters", "List the clusters of the project."),
    ("status", "status", "Show the attached cluster: target against allocated, and its nodes."),
    ("scale", "scale", "Set the preemptible GPU target (a multiple of 8)."),
    (
        "launch",
        "launch",
        "Launch a GRPO, DPO or SFT run, or your own script (train.py -- its args). As "
        "%%tg launch, the cell body is the run's YAML (script: and args: for a script).",
    ),
    ("runs", "runs", "List the runs this notebook launched or opened (--all: the cluster's)."),
    ("watch", "watch", "Show a live RunPanel (--wait: until the run has finished)."),
    ("stop", "stop", "Stop a run."),
    ("logs", "logs", "Print a run's log (-f: follow it across attempts until the run ends)."),
    (
        "events",
        "events",
        "Cluster and run events (node added, preemption notices, checkpoints, ...).",
    ),
    ("preempt", "preempt", "Preempt a node now (local emulator only)."),
    (
        "certify",
        "certify",
        "Certify a script resumes correctly: preempt and kill it beside an uninterrupted run.",
    ),
    (
        "cost",
        "cost",
        "GPU-hours on standard and preemptible nodes, work lost, and dollars, of the runs this "
        "notebook launched or opened (--all: the cluster's).",
    ),
    ("sweeps", "sweeps", "List the sweeps of the cluster (--all: of the run store)."),
    (
        "sweep",
        "sweep",
        "Show a sweep: one table of its runs (state, steps, lost, cost, best metric) and one "
        "chart of their curves with their preemptions (--stop: stop every run).",
    ),
    (
        "pt connect",
        "pt.connect",
        "Use the real service when TOGETHER_API_KEY is set, else the local emulator (--local, "
        "--remote: say which).",
    ),
    (
        "pt models",
        "pt.models",
        "Base models the service can host (LoRA max rank, sequence length).",
    ),
    (
        "pt resources",
        "pt.resources",
        "This project's model resources (active ones unless --all), with their cost so far.",
    ),
    (
        "pt start",
        "pt.start",
        "Start a model resource for a base model and wait until it is READY.",
    ),
    ("pt attach", "pt.attach", "Make an existing model resource the current one."),
    ("pt sessions", "pt.sessions", "The training sessions of the current resource."),
    (
        "pt open",
        "pt.open",
        "Open a training session (a LoRA adapter) on the current resource.",
    ),
    (
        "pt stop",
        "pt.stop",
        "Stop a session (--session) or the current resource (--force: its sessions too); "
        "--leftovers: every resource left running by a process that is gone.",
    ),
    ("pt checkpoints", "pt.checkpoints", "Checkpoints of the current resource's sessions."),
    ("pt save", "pt.save", "Save a checkpoint of a session."),
    (
        "pt download",
        "pt.download",
        "Download a checkpoint's files (adapter: LoRA weights; merged).",
    ),
    (
        "pt cost",
        "pt.cost",
        "GPU-minutes READY and their dollars so far, in all and per session.",
    ),
    ("pt panel", "pt.panel", "A live panel of the current resource: sessions, curves, cost."),
    ("pt watch", "pt.panel", "A live panel of the current resource: sessions, curves, cost."),
    ("pt events", "pt.events", "Lifecycle events of the current resource and its sessions."),
]

#: Every subcommand by its full name (``"status"``, ``"pt start"``).
COMMANDS: dict[str, Command] = {name: Command(name, path, help_) for name, path, help_ in _ROWS}


def names(group: str = "") -> list[str]:
    """The subcommands of `group` (``""``: the top level, groups included; ``"pt"``), in order."""
    if group:
        return [n.split(" ", 1)[1] for n in COMMANDS if n.startswith(f"{group} ")]
    return [n for n in COMMANDS if " " not in n] + list(GROUPS)


def usage(group: str = "") -> str:
    """``%tg --help`` (or ``%tg pt --help``): the subcommands, one line each."""
    if group:
        lines = [
            f"usage: %tg {group} SUBCOMMAND [options]   (%tg {group} SUBCOMMAND --help for each)"
        ]
        width = 12
    else:
        lines = ["%tg SUBCOMMAND [options]   (%tg SUBCOMMAND --help for each)"]
        width = 9
    lines.append("")
    for name in names(group):
        full = f"{group} {name}" if group else name
        what = GROUPS[name] if full in GROUPS else COMMANDS[full].help
        lines.append(f"  {name:<{width}} {what}")
    return "\n".join(lines)


__all__ = ["COMMANDS", "GROUPS", "Command", "names", "usage"]
