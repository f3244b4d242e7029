"""A capacity trace: the preemptible capacity the platform has, as it changes over platform time.

A trace is a list of segments, each from ``at_s`` (platform seconds since the trace was set) to the
next one: ``gpus`` preemptible GPUs are available (``null``: no limit from the trace). Before the
first segment, and where none is given, the trace limits nothing. The same document comes from the
admin route (``POST /_emulator/capacity/trace``), from `AdminClient.set_capacity_trace` and from a
file (``tgnb emulator start --capacity-trace FILE``, JSON or YAML)::

    {"segments": [{"at_s": 0, "gpus": 16}, {"at_s": 600, "gpus": 8}, {"at_s": 1500, "gpus": 16}]}

or drawn from a seed (the same seed, the same trace)::

    {"generate": {"seed": 3, "capacity_gpus": 16, "withdrawn_gpus": 8,
                  "mean_between_s": 3600, "mean_outage_s": 900, "duration_s": 86400}}

``capacity_gpus`` are available while nothing is withdrawn; withdrawals start at exponential
intervals of mean ``mean_between_s`` (from the end of the previous outage) and last an exponential
time of mean ``mean_outage_s``, during which ``capacity_gpus - withdrawn_gpus`` are available;
segments are drawn up to ``duration_s`` (default 72 h), and the last one holds after it. A
``cluster_id`` limits one cluster; without it the trace limits the preemptible GPUs of all clusters
together (as ``--capacity`` does). The fleet applies it as its clock advances: a drop below what is
live preempts the newest preemptible nodes (notice, drain window, removal) and a rise lets the
target be provisioned again (`tgnb.emulator.fleet`).
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tgnb.emulator.validation import (
    INVALID_ARGUMENT,
    MAX_GPUS,
    RequestError,
    finite_number,
    integer,
    optional_name,
)

MAX_SEGMENTS = 10_000
MAX_AT_S = 3650 * 86400.0  # ten years of platform time
MAX_TRACE_GPUS = 100 * MAX_GPUS
DEFAULT_DURATION_S = 72 * 3600.0
_TOP = frozenset({"segments", "generate", "cluster_id"})
_SEGMENT = frozenset({"at_s", "gpus"})
_GENERATE = frozenset(
    {"seed", "capacity_gpus", "withdrawn_gpus", "mean_between_s", "mean_outage_s", "duration_s"}
)


def _bad(message: str) -> RequestError:
    return RequestError(400, INVALID_ARGUMENT, message)


def _unknown(what: str, given: Any, known: frozenset[str]) -> None:
    extra = sorted(str(k)[:40] for k in set(given) - known)
    if extra:
        raise _bad(f"unknown {what} fields {extra[:5]}; known: {sorted(known)}")


@dataclass(frozen=True)
class Segment:
    at_s: float  # platform seconds since the trace started
    gpus: int | None  # preemptible GPUs available from at_s on; None: no limit


@dataclass
class CapacityTrace:
    """A validated trace (`parse`) and when it started (`started_at`, real POSIX seconds)."""

    segments: tuple[Segment, ...]
    spec: dict[str, Any]  # the document as given (what `same_as` compares)
    cluster_id: str | None = None
    started_at: float = 0.0
    _starts: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._starts = [s.at_s for s in self.segments]

    def gpus_at(self, platform_s: float) -> int | None:
        """The GPUs available `platform_s` after the start (None: the trace limits nothing)."""
        i = bisect.bisect_right(self._starts, platform_s) - 1
        return None if i < 0 else self.segments[i].gpus

    def segment_start(self, platform_s: float) -> float | None:
        """When the segment in force at `platform_s` began (None: before the first)."""
        i = bisect.bisect_right(self._starts, platform_s) - 1
        return None if i < 0 else self._starts[i]

    def next_change(self, platform_s: float) -> float | None:
        """The start of the first segment after `platform_s` (None: the last holds)."""
        i = bisect.bisect_right(self._starts, platform_s)
        return self._starts[i] if i < len(self._starts) else None

    def same_as(self, other: CapacityTrace) -> bool:
        return self.spec == other.spec

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "started_at": self.started_at}

    def view(self, platform_s: float) -> dict[str, Any]:
        """What the admin route answers: the document, its segments, where the clock is."""
        return {
            **self.spec,
            "cluster_id": self.cluster_id,
            "segments": [{"at_s": s.at_s, "gpus": s.gpus} for s in self.segments],
            "started_at": self.started_at,
            "now_s": platform_s,
            "gpus_now": self.gpus_at(platform_s),
            "next_change_s": self.next_change(platform_s),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> CapacityTrace | None:
        """A trace kept in the state file; None when it cannot be read back."""
        try:
            trace = parse(raw["spec"])
            trace.started_at = float(raw["started_at"])
        except (KeyError, TypeError, ValueError, RequestError):
            return None
        return trace


def _segments(raw: Any) -> tuple[Segment, ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad('segments must be a non-empty list such as [{"at_s": 0, "gpus": 8}]')
    if len(raw) > MAX_SEGMENTS:
        raise _bad(f"a trace has at most {MAX_SEGMENTS} segments, got {len(raw)}")
    out: list[Segment] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise _bad(f'segments[{i}] must be an object such as {{"at_s": 0, "gpus": 8}}')
        _unknown(f"segments[{i}]", item, _SEGMENT)
        if "at_s" not in item or "gpus" not in item:
            raise _bad(f"segments[{i}] needs at_s (platform seconds) and gpus (or null)")
        at = finite_number(item["at_s"], f"segments[{i}].at_s", 0.0, MAX_AT_S)
        if out and at <= out[-1].at_s:
            raise _bad(
                f"segments[{i}].at_s must be after segments[{i - 1}].at_s ({out[-1].at_s:g})"
            )
        gpus = item["gpus"]
        if gpus is not None:
            gpus = integer(gpus, f"segments[{i}].gpus (or null)", 0, MAX_TRACE_GPUS)
        out.append(Segment(at, gpus))
    return tuple(out)


def generate(raw: Any) -> tuple[Segment, ...]:
    """The segments a seeded generator document draws (deterministic in its seed)."""
    if not isinstance(raw, dict):
        raise _bad("generate must be an object with seed, capacity_gpus, withdrawn_gpus, ...")
    _unknown("generate", raw, _GENERATE)
    missing = sorted(
        {"capacity_gpus", "withdrawn_gpus", "mean_between_s", "mean_outage_s"} - set(raw)
    )
    if missing:
        raise _bad(f"generate needs {missing}")
    seed = integer(raw.get("seed", 0), "generate.seed", -(2**63), 2**63 - 1)
    full = integer(raw["capacity_gpus"], "generate.capacity_gpus", 0, MAX_TRACE_GPUS)
    cut = integer(raw["withdrawn_gpus"], "generate.withdrawn_gpus", 1, max(full, 1))
    between = finite_number(raw["mean_between_s"], "generate.mean_between_s", 1.0, MAX_AT_S)
    outage = finite_number(raw["mean_outage_s"], "generate.mean_outage_s", 1.0, MAX_AT_S)
    duration = finite_number(
        raw.get("duration_s", DEFAULT_DURATION_S), "generate.duration_s", 1.0, MAX_AT_S
    )
    if cut > full:
        raise _bad(f"generate.withdrawn_gpus ({cut}) must be at most capacity_gpus ({full})")
    if 2 * duration / (between + outage) > MAX_SEGMENTS:
        raise _bad(
            f"generate draws about {2 * duration / (between + outage):.0f} segments, over "
            f"{MAX_SEGMENTS}: raise mean_between_s or shorten duration_s"
        )
    rng = random.Random(f"tgnb-capacity-trace:{seed}")
    segments = [Segment(0.0, full)]
    t = 0.0
    while len(segments) + 2 <= MAX_SEGMENTS:
        t += rng.expovariate(1.0 / between)
        if t >= duration:
            break
        segments.append(Segment(round(t, 3), full - cut))
        t += max(rng.expovariate(1.0 / outage), 0.001)
        segments.append(Segment(round(t, 3), full))
        if t >= duration:
            break
    return tuple(segments)


def parse(raw: Any) -> CapacityTrace:
    """A trace document, checked (`RequestError` 400 with the first problem and its fix)."""
    if not isinstance(raw, dict):
        raise _bad('a capacity trace is an object: {"segments": [...]} or {"generate": {...}}')
    _unknown("capacity trace", raw, _TOP)
    if ("segments" in raw) == ("generate" in raw):
        raise _bad(
            'a capacity trace needs exactly one of segments ([{"at_s": 0, "gpus": 8}, ...]) '
            'or generate ({"seed": 0, "capacity_gpus": 16, "withdrawn_gpus": 8, ...})'
        )
    cluster_id = optional_name(raw.get("cluster_id"), "cluster_id")
    segs = _segments(raw["segments"]) if "segments" in raw else generate(raw["generate"])
    spec = json.loads(json.dumps(raw))  # a plain copy
    return CapacityTrace(segs, spec, cluster_id)


def load_file(path: str | Path) -> CapacityTrace:
    """A trace from a JSON or YAML file; `ValueError` with one line naming the fix."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"--capacity-trace {str(p)[:200]}: cannot read it ({exc.__class__.__name__})"
        ) from None
    try:
        raw = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError:
        raise ValueError(f"--capacity-trace {str(p)[:200]}: neither JSON nor YAML") from None
    try:
        return parse(raw)
    except RequestError as exc:
        raise ValueError(f"--capacity-trace {str(p)[:200]}: {exc.message}") from None
