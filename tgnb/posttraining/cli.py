"""``tgnb pt leftovers|stop --leftovers``: the model resources tgnb created that are still active
while the process that created them is gone (`tgnb.ptregistry`), and their stop.

The endpoint is `tgnb.post_training`'s default (Together with ``TOGETHER_API_KEY``, else the
tgnb home's local emulator; ``--local`` / ``--remote`` say which); nothing is started.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tgnb.errors import TgnbError

if TYPE_CHECKING:
    from tgnb.connection import Endpoint


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb pt",
        description="Post-Training model resources tgnb created and no live process holds.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--home", type=Path, default=None, help="tgnb home (default $TGNB_HOME or ~/.tgnb)"
    )
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--local", dest="local", action="store_const", const=True, default=None,
        help="the tgnb home's local emulator",
    )  # fmt: skip
    where.add_argument(
        "--remote", dest="local", action="store_const", const=False,
        help="Together (TOGETHER_API_KEY)",
    )  # fmt: skip
    sub.add_parser(
        "leftovers",
        parents=[common],
        help="list the resources left running by processes that are gone, with their cost",
    )
    stop = sub.add_parser(
        "stop", parents=[common], help="stop resources: --leftovers stops every leftover"
    )
    stop.add_argument(
        "--leftovers",
        action="store_true",
        help="stop every resource left running by a process that is gone (and its sessions)",
    )
    return p


def _endpoint(local: bool | None, home: Path | None) -> Endpoint:
    from dataclasses import replace

    from tgnb.cloud.client import DEFAULT_BASE_URL, normalize_base_url
    from tgnb.connection import connect

    end = connect(local, home=home, start=False)
    return replace(end, base_url=normalize_base_url(end.base_url) or DEFAULT_BASE_URL)


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if ns.command == "stop" and not ns.leftovers:
        print(
            "tgnb pt stop: say what to stop: --leftovers (every resource left running by a "
            "process that is gone; 'tgnb pt leftovers' lists them first)",
            file=sys.stderr,
        )
        return 2
    from tgnb import ptregistry

    try:
        conn = _endpoint(ns.local, ns.home)
        found = ptregistry.find(conn)
        if not found:
            print(f"no leftover model resources on {conn.base_url}")
            return 0
        if ns.command == "leftovers":
            print("\n".join(ptregistry.lines(found, prefix="tgnb pt")))
            return 0
        for left in found:
            print(f"stopping {ptregistry.describe(left)}")
        for rid, status in ptregistry.stop_leftovers(conn, found):
            print(f"model resources {rid} {status}")
        return 0
    except TgnbError as e:
        print(f"tgnb pt: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # an SDK failure: one line, the key scrubbed
        from tgnb.connection import fail

        try:
            fail(e, "look for leftover model resources")
        except TgnbError as err:
            print(f"tgnb pt: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
