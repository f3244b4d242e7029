"""``%tg pt stop [--session ID_OR_NAME] [--force] [--resource ID]``: `TrainingSession.stop()` or
`Resource.stop()`; ``%tg pt stop --leftovers``: `PostTraining.stop_leftovers()` (as
``tgnb pt stop --leftovers``: every resource tgnb created whose process is gone)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.notebook.commands.grammar import Parser, name_arg

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    p.add_argument("--session", type=name_arg, metavar="ID_OR_NAME", help="stop this session only")
    p.add_argument("--force", action="store_true", help="stop the resource's sessions too")
    p.add_argument("--resource", type=name_arg, help="another resource id")
    p.add_argument(
        "--leftovers",
        action="store_true",
        help="stop every resource tgnb created whose process is gone (%%tg pt resources marks them)",
    )


def run(tg: Tg, args: Any, cell: str | None) -> None:
    if args.leftovers:
        if args.session or args.resource or args.force:
            raise UsageError(
                "%tg pt stop --leftovers stops every leftover (their sessions too): "
                "drop --session, --resource and --force"
            )
        stopped = tg.pt_state().handle().stop_leftovers()
        for rid, status in stopped:
            print(f"model resource {rid} {status}")
        if not stopped:
            print("no leftover model resources")
        return
    res = tg.pt_state().current(args.resource)
    if args.session:
        if args.force:
            raise UsageError("%tg pt stop: --force stops a resource, not a session: drop it")
        info = res.session(args.session).stop()
        print(f"session {info.id} {info.status}")
        return
    info = res.stop(force=args.force)
    print(f"model resource {info.id} {info.status}")
