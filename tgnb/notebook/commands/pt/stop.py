"""``%tg pt stop [--session ID_OR_NAME] [--force] [--resource ID]``: `TrainingSession.stop()` or
`Resource.stop()`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

HELP = "Stop a session (--session) or the current resource (--force: its sessions too)."


def arguments(p: Parser) -> None:
    p.add_argument("--session", type=name_arg, metavar="ID_OR_NAME", help="stop this session only")
    p.add_argument("--force", action="store_true", help="stop the resource's sessions too")
    p.add_argument("--resource", type=name_arg, help="another resource id")


def run(tg: Tg, args: Any, cell: str | None) -> None:
    res = tg.pt_state().current(args.resource)
    if args.session:
        if args.force:
            raise UsageError("%tg pt stop: --force stops a resource, not a session: drop it")
        info = res.session(args.session).stop()
        print(f"session {info.id} {info.status}")
        return
    info = res.stop(force=args.force)
    print(f"model resource {info.id} {info.status}")
