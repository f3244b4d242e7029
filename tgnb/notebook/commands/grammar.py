"""The grammar of ``%tg``: the argparse parser each subcommand fills, errors raised as `UsageError`.

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


class Parser(argparse.ArgumentParser):
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


def at_least_zero(text: str) -> int:
    """A whole number >= 0 in ASCII digits (a count: generators, a seed)."""
    n = whole(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return n


def signed_whole(text: str) -> int:
    """Any whole number in ASCII digits, signed: its range is the Python check's to say (it knows
    the model's)."""
    if not re.fullmatch(r"-?[0-9]{1,12}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: write e.g. 8")
    return int(text)


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
