"""The subcommands of ``%tg``, one module each, in one table the `tgnb.notebook.magics.Tg` router
reads (``%tg pt ...`` too: its subcommands are rows ``"pt NAME"`` of the same table).

A subcommand module says what it is and does one call on the Python API:

- ``HELP``: one line, shown by ``%tg --help`` and as the parser's description;
- ``arguments(parser)``: its options, on a `grammar.Parser` (``%tg NAME --help`` shows them);
- ``run(tg, args, cell)``: the call, on the `Tg` magics' state (the attached session, the runs of
  this notebook, the Post-Training connection) — a bad line is a `UsageError` naming the fix;
- optionally ``USAGE`` (the usage line), ``CELL = True`` (it takes a ``%%tg`` cell body and the
  words after ``--`` on the line), ``STORES = True`` (its ``-o NAME`` stores into the namespace).

The modules import nothing heavy at import time: ``%load_ext tgnb`` imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

from tgnb.notebook.commands import (
    attach,
    certify,
    clusters,
    cost,
    events,
    launch,
    logs,
    preempt,
    runs,
    scale,
    status,
    stop,
    watch,
)
from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.commands.pt import attach as pt_attach
from tgnb.notebook.commands.pt import checkpoints as pt_checkpoints
from tgnb.notebook.commands.pt import connect as pt_connect
from tgnb.notebook.commands.pt import cost as pt_cost
from tgnb.notebook.commands.pt import download as pt_download
from tgnb.notebook.commands.pt import events as pt_events
from tgnb.notebook.commands.pt import models as pt_models
from tgnb.notebook.commands.pt import open as pt_open
from tgnb.notebook.commands.pt import panel as pt_panel
from tgnb.notebook.commands.pt import resources as pt_resources
from tgnb.notebook.commands.pt import save as pt_save
from tgnb.notebook.commands.pt import sessions as pt_sessions
from tgnb.notebook.commands.pt import start as pt_start
from tgnb.notebook.commands.pt import stop as pt_stop


@dataclass
class Command:
    """One row of the table: a subcommand's name (``"status"``, ``"pt start"``) and its module."""

    name: str
    module: ModuleType
    _parser: Parser | None = field(default=None, repr=False)

    @property
    def help(self) -> str:
        return str(self.module.HELP)

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

_ROWS: list[tuple[str, ModuleType]] = [
    ("attach", attach),
    ("clusters", clusters),
    ("status", status),
    ("scale", scale),
    ("launch", launch),
    ("runs", runs),
    ("watch", watch),
    ("stop", stop),
    ("logs", logs),
    ("events", events),
    ("preempt", preempt),
    ("certify", certify),
    ("cost", cost),
    ("pt connect", pt_connect),
    ("pt models", pt_models),
    ("pt resources", pt_resources),
    ("pt start", pt_start),
    ("pt attach", pt_attach),
    ("pt sessions", pt_sessions),
    ("pt open", pt_open),
    ("pt stop", pt_stop),
    ("pt checkpoints", pt_checkpoints),
    ("pt save", pt_save),
    ("pt download", pt_download),
    ("pt cost", pt_cost),
    ("pt panel", pt_panel),
    ("pt watch", pt_panel),
    ("pt events", pt_events),
]

#: Every subcommand by its full name (``"status"``, ``"pt start"``).
COMMANDS: dict[str, Command] = {name: Command(name, module) for name, module in _ROWS}


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
