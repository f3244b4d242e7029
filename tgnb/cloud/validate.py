"""Checks made before any request is sent. A failure is a `ValidationError`; nothing was sent."""

from __future__ import annotations

from typing import Any

from tgnb.errors import ValidationError
from tgnb.runs.spec import GPUS_PER_NODE  # preemptible (and standard) GPUs come in whole nodes

#: Most GPUs tgnb asks for in one count (256 nodes). The platform publishes no limit; the
#: emulator refuses more too (`tgnb.emulator.validation.MAX_GPUS`).
MAX_GPUS = 2048
#: Longest cluster name or id accepted.
MAX_NAME = 256


def nearest_multiples(value: int, step: int = GPUS_PER_NODE) -> tuple[int, int]:
    """The two multiples of `step` around `value` (never below 0), lower first."""
    lower = max((value // step) * step, 0)
    return lower, lower + step


def check_target(
    value: Any, project_id: str | None, what: str = "preemptible target", hint: str = ""
) -> int:
    """A preemptible GPU target: an int (not a bool, not a str), >= 0, a multiple of 8, and a
    project known when it is above 0. Returns it as an int."""
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            hint = f": pass the number {int(value.strip())}, not the string {value!r}"
        raise ValidationError(
            f"the {what} must be an integer number of GPUs, got {type(value).__name__} "
            f"{value!r}{hint or ': pass e.g. 8 or 16'}"
        )
    if value < 0:
        raise ValidationError(f"the {what} must be >= 0, got {value}: try 0 to release all, or 8")
    if value > MAX_GPUS:
        raise ValidationError(
            f"the {what} must be at most {MAX_GPUS} GPUs, got {value}: ask for fewer nodes"
        )
    if value % GPUS_PER_NODE:
        lo, hi = nearest_multiples(value)
        raise ValidationError(
            f"the {what} must be a multiple of {GPUS_PER_NODE}, got {value}: try {lo} or {hi}"
        )
    if value > 0 and not project_id:
        raise ValidationError(
            f"a {what} above 0 needs a project{hint}: set TOGETHER_PROJECT_ID or pass "
            "Cloud(project_id=...)"
        )
    return value


def check_gpus(value: Any, what: str = "number of standard GPUs") -> int:
    """A standard GPU count for create: an int >= 8 and a multiple of 8."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(f"the {what} must be an integer, got {value!r}: pass e.g. 8")
    if value > MAX_GPUS:
        raise ValidationError(f"the {what} must be at most {MAX_GPUS}, got {value}")
    if value < GPUS_PER_NODE or value % GPUS_PER_NODE:
        lo, hi = nearest_multiples(max(value, GPUS_PER_NODE))
        raise ValidationError(
            f"the {what} must be a multiple of {GPUS_PER_NODE} and at least {GPUS_PER_NODE} "
            f"(every cluster keeps one standard node), got {value}: try {lo} or {hi}"
        )
    return value


def check_name(value: Any, what: str = "cluster name or id") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"the {what} must be a non-empty string, got {value!r:.60}")
    value = value.strip()
    if len(value) > MAX_NAME or not value.isprintable():
        raise ValidationError(
            f"the {what} must be printable and at most {MAX_NAME} characters, got {value!r:.60}"
        )
    return value
