"""The one escaping function of every rendered string, and its plain-text half.

Names, reasons and messages come from outside (an ``events.jsonl`` line, a ``@tgnb`` line a pod
prints, the API's ``node_lifecycle_events``, a run's or a session's name). Every renderer — the
timeline SVG, the panels' HTML, the static exports, the tables, the server extension's JSON — puts
them through here:

- `plain`: the text with every registered secret masked (`tgnb.config.scrub`: a run's error line
  or a node's message may quote a token the program read), bidirectional control characters (U+202A–U+202E, U+2066–U+2069, U+200E,
  U+200F, U+061C: they reorder what a reader sees, so ``evil\\u202etxt.exe`` reads as another
  name) and C0 control characters other than tab, newline and carriage return (invalid in XML,
  so one NUL breaks an SVG) dropped. For text that is not markup: JSON a front end renders as
  text, text tables.
- `escape`: `plain`, then HTML/XML-escaped with quotes, so the result is safe in element text and
  in a quoted attribute value alike.
- `plain_json`: `plain` applied to every string (keys too) of a JSON value, and a number JSON
  cannot hold (NaN, infinities: Python writes ``NaN``, which a browser's ``JSON.parse`` refuses,
  dropping the whole message) made null.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any, TypeVar, cast

from tgnb.config import scrub

T = TypeVar("T")

#: Bidirectional formatting characters and the C0 controls XML does not allow.
_DROPPED = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\x00-\x08\x0b\x0c\x0e-\x1f]")


def plain(text: object) -> str:
    """`text` as a string, secrets masked, without bidi controls or C0 controls (tab, newline,
    CR kept)."""
    return scrub(_DROPPED.sub("", str(text)))


def escape(text: object) -> str:
    """`text` ready for HTML or SVG: `plain`, then ``& < > " '`` escaped."""
    return html.escape(plain(text), quote=True)


def plain_json(value: T) -> T:
    """A JSON value with `plain` applied to each string in it (dicts, lists and tuples walked)
    and each float that is not finite made None (valid JSON: null)."""
    out: Any = value
    if isinstance(value, str):
        out = plain(value)
    elif isinstance(value, float) and not math.isfinite(value):
        out = None
    elif isinstance(value, dict):
        out = {plain(k) if isinstance(k, str) else k: plain_json(v) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        out = type(value)(plain_json(v) for v in value)
    return cast(T, out)


__all__ = ["escape", "plain", "plain_json"]
