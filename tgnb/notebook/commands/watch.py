"""``%tg watch RUN [--wait [--timeout 1h]]``: a live `RunPanel` of a run; with ``--wait`` the cell
lasts until the run has finished (Run All goes on from its end state)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.notebook.commands.grammar import Parser, duration, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("run", type=name_arg, help="run name or id")
    p.add_argument(
        "--wait",
        action="store_true",
        help="the cell lasts until the run has finished (succeeded, failed or cancelled)",
    )
    p.add_argument(
        "--timeout",
        type=duration,
        default=None,
        help="how long to wait, e.g. 30m (more than 0; without --timeout: until it finishes)",
    )


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    from tgnb.notebook.widgets import RunPanel

    if args.timeout is not None and not args.wait:
        raise UsageError("--timeout goes with --wait: %tg watch RUN --wait --timeout 30m")
    found = tg.find_run(args.run)
    panel = RunPanel(found, poll_interval=tg.poll_interval)
    if tg.in_kernel:
        panel.show()  # displayed, not returned: its fallback is brought up to date as the cell ends
    if args.wait:
        timeout = None if args.timeout is None else args.timeout.total_seconds()
        try:
            found.wait(timeout=timeout, poll=min(tg.poll_interval, 0.5), progress=False)
        except TimeoutError as exc:
            raise UsageError(f"{exc}: wait longer (--timeout 2h) or leave out --wait") from None
        panel.refresh()
    return None if tg.in_kernel else panel  # no front end to update: the caller shows it
