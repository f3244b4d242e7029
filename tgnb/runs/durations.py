"""The range of every duration a run's settings hold (seconds), checked in one place.

A duration reaches a ``threading.Event.wait`` (over about 9.2e9 s: ``OverflowError``), a bash
integer in an sbatch script (over 2**63: it wraps to a negative sleep) or a comparison with
``time.time()``; a value past its range is a unit slip (milliseconds, a date), refused at launch
with the range in the message.
"""

from __future__ import annotations

import math
from typing import Any

from tgnb.errors import ValidationError

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0

#: name -> (low, high, low allowed, an example): the range of each duration setting, in seconds.
RANGES: dict[str, tuple[float, float, bool, float]] = {
    # tgnb.runs.recovery.RecoveryPolicy
    "backoff_s": (0.0, DAY, True, 5),
    "backoff_max_s": (0.0, DAY, True, 300),
    "wait_s": (0.0, 30 * DAY, True, 600),
    # tgnb.runs.policy.CheckpointPolicy (the ``checkpoint:`` section)
    # under 10 ms is a unit slip (``1e-9``: nanoseconds?), not an interval: a save every step
    "checkpoint.every_seconds": (0.01, 30 * DAY, True, 1800),
    "checkpoint.drain_poll_seconds": (0.0, MINUTE, False, 2),
}
#: How far ahead a deadline may be (past it, a POSIX time is in milliseconds, or a typo).
DEADLINE_AHEAD_S = 3653 * DAY


def span(seconds: float) -> str:
    """``60 s``, ``1 day``, ``30 days``: a range's end in words."""
    if seconds >= DAY:
        days = seconds / DAY
        return f"{days:g} day" + ("" if days == 1 else "s")
    if seconds >= HOUR:
        return f"{seconds / HOUR:g} h"
    return f"{seconds:g} s"


def check_seconds(name: str, value: Any, error: type[ValidationError] = ValidationError) -> None:
    """`value` is a finite number of seconds in the range `RANGES` gives `name`; else `error`
    with one line naming the range."""
    low, high, low_ok, example = RANGES[name]
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and (value > low or (low_ok and value == low))
    if not (ok and value <= high):
        first = f">= {low:g}" if low_ok else f"above {low:g}"
        words = "" if high < HOUR else f" ({span(high)})"
        raise error(
            f"{name} must be a number of seconds {first} and at most {high:.0f}{words}, "
            f"got {value!r:.40}: e.g. {name.rpartition('.')[2]}={example:g}"
        )


def check_deadline(deadline: Any, now: float) -> None:
    """`deadline` is a POSIX time (seconds) after `now` and at most `DEADLINE_AHEAD_S` ahead:
    not NaN, not a duration (``6 * 3600`` is 1970), not in milliseconds."""
    number = isinstance(deadline, int | float) and not isinstance(deadline, bool)
    if number and math.isfinite(deadline) and now < deadline <= now + DEADLINE_AHEAD_S:
        return
    why = "not a number"
    if number and math.isfinite(deadline):
        why = "in the past" if deadline <= now else "over 10 years ahead: in milliseconds?"
    raise ValidationError(
        f"deadline must be a POSIX time in seconds, in the future and within 10 years, got "
        f"{deadline!r:.40} ({why}): e.g. "
        "deadline=time.time() + 6 * 3600"
    )
