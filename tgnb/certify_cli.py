"""``tgnb certify [options] train.py [ARGS...]`` (or ``--command CMD...``): certify a program on a
fresh local emulator of its own (started in a temporary tgnb home, stopped at the end), print the
certificate, and exit 0 when it is safe, 1 when it is not (so it gates CI), 2 on bad input.

A script over a `tgnb.session.Session` (the plane of `tgnb.demo`): `tgnb.certify` itself takes the
session it is given, so the session can offer `Session.certify` without a circle."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tgnb.errors import TgnbError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb certify",
        description="Run a training program under preemptions, kills and restarts on the local "
        "emulator, beside an uninterrupted run, and certify it resumes correctly.",
    )
    p.add_argument("script", nargs="?", help="the script, relative to --workdir")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.add_argument("--command", help="a command instead of a script, e.g. 'accelerate launch t.py'")
    p.add_argument("--workdir", default=".", help="the program's folder (default: here)")
    p.add_argument("--budget-s", type=float, default=900.0, help="time budget in seconds")
    p.add_argument("--seed", type=int, default=None, help="seed of the random step events")
    p.add_argument(
        "--save-every",
        type=int,
        default=None,
        help="a periodic save interval of certify's own, in steps (default: the program's own "
        "checkpoint policy, as a real launch runs it)",
    )
    p.add_argument(
        "--events", default=None, help="only these events, e.g. kill,shrink (default: all)"
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes the program runs on (default 1)")
    p.add_argument(
        "--min-nodes", type=int, default=None, help="fewest nodes it may shrink to (a shrink event)"
    )
    p.add_argument(
        "--fault-tolerance",
        default=None,
        help="torchft: run the nodes as TorchFT replica groups (needs --nodes 2 or more) and "
        "certify that survivors go on and a replacement heals from a peer",
    )
    return p


def _bad_input(ns: argparse.Namespace) -> str | None:
    """What is wrong with the command line, in one line naming the fix; None when nothing."""
    if bool(ns.script) == bool(ns.command):
        return "give a script or --command, not both or neither"
    if not (math.isfinite(ns.budget_s) and ns.budget_s > 0):
        return f"--budget-s must be a number of seconds above 0, not {ns.budget_s}: e.g. 600"
    if ns.command:
        try:
            words = shlex.split(ns.command)
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            return (
                f"--command {ns.command!r:.80} cannot be split as a shell would: {exc} "
                "(close the quote, e.g. --command \"python 'ok.py'\")"
            )
        if not words:
            return "--command is empty: give the command, e.g. --command 'accelerate launch t.py'"
    from tgnb.certify.core import check_fault_tolerance
    from tgnb.errors import ValidationError

    try:
        check_fault_tolerance(ns.fault_tolerance, ns.nodes, ns.min_nodes)
    except ValidationError as exc:  # its fix names the flag too
        return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    bad = _bad_input(ns)
    if bad:  # before an emulator is started: bad input is the usage exit, one line
        print(f"tgnb certify: {bad}", file=sys.stderr)
        return 2
    command = shlex.split(ns.command) if ns.command else None
    from tgnb.certify import certify
    from tgnb.session import attach, shutdown_local

    with tempfile.TemporaryDirectory(prefix="tgnb-certify-") as home:
        try:
            session = attach(local=True, home=home, create=True)
            session.scale(preemptible=16, wait=True, timeout=120, poll=0.2)
            cert = certify(
                session,
                ns.script,
                args=ns.args or None,
                command=command,
                workdir=Path(ns.workdir),
                seed=ns.seed,
                budget_s=ns.budget_s,
                save_every=ns.save_every,
                nodes=ns.nodes,
                min_nodes=ns.min_nodes,
                events=ns.events.split(",") if ns.events else None,
                fault_tolerance=ns.fault_tolerance,
            )
        except TgnbError as exc:
            print(f"tgnb certify: {exc}", file=sys.stderr)
            return 2
        finally:
            shutdown_local(home)
    print(cert)
    return cert.exit_code
