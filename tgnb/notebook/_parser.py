"""The grammar of ``%tg``: one argparse parser per subcommand, errors raised as `UsageError`.

argparse normally prints to stderr and exits; here a bad line raises IPython's `UsageError` with a
one-line message that names the fix, and ``--help`` raises `HelpShown` carrying the help text.
"""

from __future__ import annotations

import argparse
import difflib
import keyword
import math
import re
from datetime import timedelta
from typing import Any, NoReturn

from IPython.core.error import UsageError

from tgnb.events import parse_duration


class HelpShown(Exception):
    """``--help`` was asked for; `text` is what to print."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of exiting, and refuses an option given twice
    (argparse keeps the last one silently) unless it is one to repeat (``--set``, ``--reward``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise HelpShown(self.format_help())

    def print_help(self, file: Any = None) -> None:
        raise HelpShown(self.format_help())

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._refuse_repeats(list(args or []))
        return super().parse_known_args(args, namespace)

    def _refuse_repeats(self, words: list[str]) -> None:
        known = self._option_string_actions
        seen: dict[int, str] = {}
        for word in words:
            if word == "--":
                break
            if not word.startswith("-"):
                continue
            opt = word.split("=", 1)[0]
            action = known.get(opt)
            if action is None and opt.startswith("--"):  # an abbreviation argparse accepts
                hits = {id(a): a for o, a in known.items() if o.startswith(opt)}
                action = next(iter(hits.values())) if len(hits) == 1 else None
            if action is None or isinstance(action, argparse._AppendAction):
                continue
            if id(action) in seen:
                raise UsageError(
                    f"{self.prog}: {seen[id(action)]} is given twice: give it once "
                    f"(see {self.prog} --help)"
                )
            seen[id(action)] = "/".join(action.option_strings)


def duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``2h``, ``1d`` (or plain seconds) as a timedelta: more than 0 (a
    ``--timeout 0`` is refused, not read as "wait forever") and at most ten years
    (`tgnb.events.parse_duration`, the one duration parser)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_WHOLE = re.compile(r"^[+-]?[0-9]+$")
_NUMBER = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$")


def whole(text: str) -> int:
    """A whole number in ASCII digits (``1_6`` and other scripts' digits are refused: Python's
    `int` reads both as 16)."""
    if not _WHOLE.fullmatch(text.strip()) or len(text.strip()) > 30:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number: write e.g. 16")
    return int(text)


def number(text: str) -> float:
    """A finite number in ASCII digits, e.g. ``0.5`` or ``1e-4``."""
    if not _NUMBER.fullmatch(text.strip()) or not math.isfinite(float(text)):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a finite number: write e.g. 1e-4")
    return float(text)


def gpus(text: str) -> int:
    """A GPU count as written on the line; the multiple-of-8 rule is the Python API's to check."""
    try:
        return whole(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of GPUs: write e.g. 8 or 16"
        ) from None


#: Longest name (cluster, run, node, resource, session, checkpoint) a line may carry.
MAX_NAME = 256


def name_arg(text: str) -> str:
    """A name or id: not empty (``preempt ''`` would mean "the default node"), printable, no
    spaces, at most `MAX_NAME` characters."""
    if not text.strip() or len(text) > MAX_NAME or not text.isprintable() or " " in text:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a name: write a name or id without spaces "
            f"(at most {MAX_NAME} characters)"
        )
    return text


def out_name(text: str) -> str:
    """The variable ``-o`` stores into: a Python identifier that is no keyword and no dunder
    (``-o __builtins__`` would replace the namespace's builtins)."""
    if (
        not text.isidentifier()
        or not text.isascii()
        or keyword.iskeyword(text)
        or (text.startswith("__") and text.endswith("__"))
    ):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a Python name to store into: try run1"
        )
    return text


def build() -> dict[str, _Parser]:
    """One parser per subcommand, by name."""
    p: dict[str, _Parser] = {}

    def sub(name: str, help: str, usage: str | None = None) -> _Parser:
        parser = _Parser(prog=f"%tg {name}", description=help, usage=usage, add_help=True)
        p[name] = parser
        return parser

    a = sub(
        "attach", "Attach this notebook to a cluster (by name or id), or to the local emulator."
    )
    a.add_argument(
        "cluster", nargs="?", type=name_arg, help="cluster name or id (default: Tg.default_cluster)"
    )
    a.add_argument(
        "--local", action="store_true", help="use the local emulator, start it if needed"
    )
    a.add_argument(
        "--time-scale",
        type=number,
        default=None,
        help="the local emulator's time scale (default: the running one's, else 0.02)",
    )

    sub("clusters", "List the clusters of the project.")
    sub("status", "Show the attached cluster: target against allocated, and its nodes.")

    s = sub("scale", "Set the preemptible GPU target (a multiple of 8).")
    s.add_argument("--preemptible", type=gpus, required=True, metavar="N", help="GPUs, e.g. 16")
    s.add_argument(
        "--wait", action="store_true", help="show allocated against desired until reached"
    )
    s.add_argument(
        "--timeout",
        type=duration,
        default=None,
        help="how long to wait, e.g. 15m (more than 0; without --timeout: until reached)",
    )

    la = sub(
        "launch",
        "Launch a GRPO, DPO or SFT run, or your own script (train.py -- its args). As "
        "%%tg launch, the cell body is the run's YAML (script: and args: for a script).",
        usage="%(prog)s grpo|dpo|sft|SCRIPT.py [options] [-o NAME] [-- SCRIPT ARGS]",
    )
    la.add_argument(
        "algorithm", nargs="?", help="grpo, dpo, sft, or a script of the workdir (train.py)"
    )
    la.add_argument("--workdir", help="the folder shipped with the run (default: the notebook's)")
    la.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and print the config as the node will run it; launch nothing",
    )
    la.add_argument("--name", help="the run's name (default: generated)")
    la.add_argument("--model", help="model name or path")
    la.add_argument("--dataset", help="dataset name")
    la.add_argument("--reward", dest="rewards", action="append", help="reward (repeat for several)")
    la.add_argument("--steps", dest="max_steps", type=whole, help="max_steps")
    la.add_argument("--lr", type=number, help="learning rate (trl.learning_rate)")
    la.add_argument("--seed", type=whole, help="random seed")
    la.add_argument("--nodes", type=whole, help="nodes (default 1)")
    la.add_argument("--gpus-per-node", type=whole, help="GPUs per node (default 8)")
    la.add_argument("--min-nodes", type=whole, help="fewest nodes a restart may use (shrink)")
    la.add_argument(
        "--recovery",
        choices=("wait", "shrink", "standard"),
        help="when preemptible capacity is short at a restart: wait (default), shrink, standard",
    )
    kind = la.add_mutually_exclusive_group()
    kind.add_argument(
        "--preemptible",
        dest="preemptible",
        action="store_true",
        default=None,
        help="run on preemptible nodes (the default)",
    )
    kind.add_argument(
        "--standard", dest="preemptible", action="store_false", help="run on standard nodes"
    )
    la.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other config key, dotted (e.g. trl.num_generations=4); value read as YAML",
    )
    la.add_argument(
        "-o",
        "--out",
        type=out_name,
        metavar="NAME",
        help="store the Run under NAME in the namespace",
    )

    ru = sub("runs", "List the runs this notebook launched or opened (--all: the cluster's).")
    ru.add_argument("--all", action="store_true", help="every run of the attached cluster")
    for cmd, what in (("watch", "Show a live RunPanel"), ("stop", "Stop a run")):
        sub(cmd, f"{what}.").add_argument("run", type=name_arg, help="run name or id")
    lg = sub("logs", "Print a run's log.")
    lg.add_argument("run", type=name_arg, help="run name or id")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")

    e = sub("events", "Cluster and run events (node added, preemption notices, checkpoints, ...).")
    e.add_argument("--since", type=duration, default=None, help="e.g. 30m, 2h, 1d")
    e.add_argument("--node", type=name_arg, help="only this node's events")
    e.add_argument("--run", type=name_arg, help="only this run's events")
    e.add_argument(
        "--watch", action="store_true", help="keep printing new events (interrupt to stop)"
    )
    e.add_argument("--timeline", action="store_true", help="draw them as an EventTimeline")

    pr = sub("preempt", "Preempt a node now (local emulator only).")
    pr.add_argument(
        "node", nargs="?", type=name_arg, help="node name (default: the oldest preemptible node)"
    )

    co = sub(
        "cost",
        "GPU-hours on standard and preemptible nodes, and work lost, of the runs this notebook "
        "launched or opened (--all: the cluster's).",
    )
    co.add_argument("--all", action="store_true", help="every run of the attached cluster")
    # Routed to tgnb.notebook._pt_magics, which has its own subcommands (%tg pt --help).
    sub("pt", "Post-Training: models, resources, sessions, checkpoints, cost, panel.")
    return p


def nearest(word: str, choices: list[str]) -> str:
    """`` did you mean 'x'?`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f": did you mean {close[0]!r}?" if close else ""


def unknown_options(prog: str, extras: list[str], parser: argparse.ArgumentParser) -> UsageError:
    """The error for options the parser does not know, naming the nearest known one."""
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    bad = next((x for x in extras if x.startswith("-")), extras[0])
    hint = nearest(bad.split("=")[0], options) if bad.startswith("-") else ""
    what = "option" if bad.startswith("-") else "argument"
    return UsageError(f"{prog}: unknown {what} {bad!r}{hint} (see {prog} --help)")
