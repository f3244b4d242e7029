"""``%tg cost``'s report: GPU-hours of runs on standard and preemptible nodes, the work lost to
preemptions, and their dollars at the cluster's prices per GPU-hour (`tgnb.prices`: ``%config``,
else the platform's, else the published rates). The counting is `tgnb.runs.cost`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tgnb.events import Event
from tgnb.markup import escape
from tgnb.prices import Prices, dollars
from tgnb.runs.cost import RunCost, run_cost


@dataclass
class CostReport:
    """GPU-hours of a session's runs and their dollars at `prices` (None: not known)."""

    runs: list[RunCost] = field(default_factory=list)
    prices: Prices | None = None
    #: which runs these are (``%tg cost``: this notebook's, or the cluster's with --all)
    scope: str = ""

    def total(self, attr: str) -> float:
        return float(sum(getattr(r, attr) or 0 for r in self.runs))

    @property
    def cost(self) -> float | None:
        """Dollars of all the runs (None without prices)."""
        if self.prices is None:
            return None
        return self.prices.cost(
            self.total("standard_gpu_hours"), self.total("preemptible_gpu_hours")
        )

    def _rows(self) -> list[list[str]]:
        rows = [
            [
                r.run,
                str(r.gpus),
                f"{r.standard_gpu_hours:.3f}",
                f"{r.preemptible_gpu_hours:.3f}",
                str(r.preemptions),
                f"{r.lost_gpu_hours:.3f}",
                _steps(r.lost_steps),
                dollars(r.dollars(self.prices)),
            ]
            for r in self.runs
        ]
        rows.append(
            [
                "total",
                "",
                f"{self.total('standard_gpu_hours'):.3f}",
                f"{self.total('preemptible_gpu_hours'):.3f}",
                str(int(self.total("preemptions"))),
                f"{self.total('lost_gpu_hours'):.3f}",
                _steps(
                    None
                    if any(r.lost_steps is None for r in self.runs)
                    else int(self.total("lost_steps"))
                ),
                dollars(self.cost),
            ]
        )
        return rows

    _HEAD = (
        "RUN",
        "GPUS",
        "STANDARD GPU-H",
        "PREEMPTIBLE GPU-H",
        "PREEMPTIONS",
        "LOST GPU-H",
        "LOST STEPS",
        "COST",
    )

    def _footer(self) -> str:
        if self.prices is None:
            return (
                "no prices for this cluster's GPU type: %config Tg.standard_price = 2.5 and "
                "Tg.preemptible_price = 1.2 (dollars per GPU-hour)"
            )
        return f"cost {dollars(self.cost)} at {self.prices.line()}"

    def __str__(self) -> str:
        rows = [list(self._HEAD), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        lines = [
            "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
        ]
        head = [f"({self.scope})"] if self.scope else []
        return "\n".join([*head, *lines, self._footer()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        e = escape
        head = "".join(f"<th>{e(h.lower())}</th>" for h in self._HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in self._rows()
        )
        scope = f"<caption>{e(self.scope)}</caption>" if self.scope else ""
        return (
            f'<div class="tgnb-cost"><table style="word-break:normal;overflow-wrap:normal">{scope}<thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            f"</table><div>{e(self._footer())}</div></div>"
        )


def _steps(n: int | None) -> str:
    """A count of steps; ``unknown`` when the program reports none."""
    return "unknown" if n is None else str(n)


def session_cost(
    runs: Mapping[str, tuple[Iterable[Event], int]],
    prices: Prices | None = None,
    now: datetime | None = None,
) -> CostReport:
    """A `CostReport` for runs given as ``{name: (events, gpus)}``, at `prices`."""
    report = CostReport([], prices)
    for name, (events, gpus) in runs.items():
        report.runs.append(run_cost(name, events, gpus, now))
    return report


__all__ = ["CostReport", "RunCost", "run_cost", "session_cost"]
