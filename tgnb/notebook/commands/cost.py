"""``%tg cost [--all]``: a `tgnb.notebook.cost.CostReport` of the runs this notebook launched or
opened (``--all``: the cluster's), from their lifecycle events, in dollars at the cluster's prices
per GPU-hour (``%config Tg.standard_price`` / ``Tg.preemptible_price`` override them). Before it,
one line per Post-Training model resource tgnb created that still bills while the process that
created it is gone (`tgnb.ptregistry`), with what it has cost: they bill too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.tables import scope_words

if TYPE_CHECKING:
    from tgnb.notebook.cost import CostReport
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--all", action="store_true", help="every run of the attached cluster")


def run(tg: Tg, args: Any, cell: str | None) -> CostReport:
    from tgnb.notebook.cost import CostReport

    _say_leftovers(tg)  # first: they bill whether or not a cluster is attached
    # each run's own figures (`Run.cost`: the engine's meter, up to the run's end), as its
    # summary, panel and the sidebar give them
    report = CostReport([r.cost() for r in tg.notebook_runs(args.all)], tg.prices())
    report.scope = scope_words(args.all, tg.others(args.all))
    return report


def _say_leftovers(tg: Tg) -> None:
    """The Post-Training leftovers (asked only when the registry holds an entry whose process
    is gone: no request otherwise)."""
    from tgnb.config import default_home
    from tgnb.ptregistry import Registry, lines

    if not Registry(default_home()).any_gone():
        return
    for line in lines(tg.pt_state().handle().leftovers(), prefix="%tg cost"):
        print(line)
