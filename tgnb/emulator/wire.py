"""The emulator's wire rules for request bodies: JSON parsed strictly (no NaN or Infinity, at most
`MAX_DEPTH` deep), bodies capped at `MAX_BODY` bytes, and bodies masked for the request log (secret
keys of JSON objects; ``word=value`` secrets and the key in any other text). Shared by every route
family (clusters, admin, Post-Training)."""

from __future__ import annotations

import json
import re
from typing import Any

from tgnb.emulator.validation import INVALID_ARGUMENT, RequestError

#: Largest request body read (bytes); beyond it the answer is 413 and the rest is not read.
MAX_BODY = 1 << 20
#: Deepest JSON nesting accepted in a body.
MAX_DEPTH = 32
_SECRET_WORDS = ("key", "token", "secret", "password", "authorization", "credential")


def scrub_body(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: ("***" if any(w in str(k).lower() for w in _SECRET_WORDS) else scrub_body(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [scrub_body(v) for v in value]
    return value


#: ``word=value``, ``word: value`` and ``"word": "value"`` in a body that is not JSON (a form, text)
_SECRET_TEXT = re.compile(
    r"""(?i)([\w.-]*(?:key|token|secret|password|authorization|credential)[\w.-]*["']?\s*[=:]\s*)"""
    r"""("[^"]*"|'[^']*'|bearer\s+\S+|[^\s&,;}]+)"""
)


def scrub_text(text: str, key: str) -> str:
    """A non-JSON body as the log keeps it: secret-looking values and the key masked, then cut."""
    if key:
        text = text.replace(key, "***")
    text = _SECRET_TEXT.sub(lambda m: m.group(1) + "***", text[:1024])  # bounded regex work
    return text[:200]


def depth_ok(value: Any, limit: int) -> bool:
    """Whether `value` nests at most `limit` containers deep (iterative: no recursion to blow)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children)
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """A request body as JSON; NaN/Infinity, nesting deeper than `MAX_DEPTH` and invalid UTF-8
    are `RequestError` 400s."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise RequestError(
            400, INVALID_ARGUMENT, "request body is not valid JSON (NaN and Infinity are refused)"
        ) from None
    if not depth_ok(value, MAX_DEPTH):
        raise RequestError(400, INVALID_ARGUMENT, f"request body nests deeper than {MAX_DEPTH}")
    return value
