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
    from tgnb.events import Event
    from tgnb.notebook.cost import CostReport
    from tgnb.notebook.magics import Tg

HELP = (
    "GPU-hours on standard and preemptible nodes, work lost, and dollars, of the runs this "
    "notebook launched or opened (--all: the cluster's)."
)


def arguments(p: Parser) -> None:
    p.add_argument("--all", action="store_true", help="every run of the attached cluster")


def run(tg: Tg, args: Any, cell: str | None) -> CostReport:
    from tgnb.notebook.cost import session_cost

    _say_leftovers(tg)  # first: they bill whether or not a cluster is attached
    by_name: dict[str, tuple[list[Event], int]] = {}
    for r in tg.notebook_runs(args.all):
        res = r.record.spec.resources
        by_name[r.name] = (r.run_events(), int(res.gpus_per_node) * int(res.nodes))
    report = session_cost(by_name, tg.prices())
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
