"""``%tg scale --preemptible N [--wait [--timeout 15m]]``: `Session.scale`, with a live panel (or a
text bar in a terminal IPython) while it waits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser, duration, gpus

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--preemptible", type=gpus, required=True, metavar="N", help="GPUs, e.g. 16")
    p.add_argument(
        "--wait", action="store_true", help="show allocated against desired until reached"
    )
    p.add_argument(
        "--timeout",
        type=duration,
        default=None,
        help="how long to wait, e.g. 15m (more than 0; without --timeout: until reached)",
    )


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    session = tg.attached()
    if not args.wait:
        return session.scale(args.preemptible)
    wait: dict[str, Any] = {"wait": True}
    if args.timeout:
        wait["timeout"] = args.timeout.total_seconds()
    if not tg.in_kernel:  # a terminal IPython: a text bar
        from tgnb.progress import CapacityBar

        bar = CapacityBar(args.preemptible)
        try:
            return session.scale(args.preemptible, callback=bar.update, **wait)
        finally:
            bar.close()
    from tgnb.notebook.widgets import ClusterPanel

    panel = ClusterPanel(session, poll_interval=tg.poll_interval, start=False)
    panel.show()  # its static fallback is brought up to date after the cell (post_run_cell)
    return session.scale(args.preemptible, callback=panel.update, **wait)
