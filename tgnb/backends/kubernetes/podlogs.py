"""A run's pod logs after a cursor: each poll asks only for what its pods logged since the last.

The Kubernetes API reads a container's log from its start, or from ``sinceSeconds`` before the
kubelet's now (the Python client has no ``sinceTime``), with each line's own timestamp
(``timestamps=true``, RFC 3339 with nanoseconds). The cursor (`PodMark` per pod) keeps the last
line's timestamp, how many lines carried it, and the API server's clock against this machine's
(its ``Date`` header): the next read asks from a little before that line (`MARGIN` seconds, as
the clocks are known to a second) and drops what was read already. A pod whose container had
terminated before its log was read to the end is never asked again: the attempts a preemption
ended cost nothing after their first read.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from tgnb.backends.kubernetes import labels as L
from tgnb.backends.kubernetes.apierrors import api_error
from tgnb.runs.cursor import LogChunk

#: Seconds asked before the last line read: the API server's clock is known to a second, and
#: the kubelet's is assumed within a few of it.
MARGIN = 10


@dataclass(frozen=True)
class PodMark:
    """How far one pod's log was read: the last line's timestamp (`at`: seconds, nanoseconds),
    how many lines read carried it (`same`), the API server's clock minus this machine's
    (`skew`, seconds) and whether its container had ended before the read (`done`)."""

    at: tuple[str, int] | None = None
    same: int = 0
    skew: float = 0.0
    done: bool = False


def stamp(text: str) -> tuple[str, int] | None:
    """The sort key of an RFC 3339 timestamp (``2026-12-07T00:53:44.1234Z``): the whole seconds
    as written and the nanoseconds; None for anything else."""
    if not text.endswith("Z") or "T" not in text:
        return None
    whole, _, frac = text[:-1].partition(".")
    if not frac.isdigit() and frac:
        return None
    return whole, int((frac or "0").ljust(9, "0")[:9])


def _epoch(at: tuple[str, int]) -> float:
    t = datetime.strptime(at[0], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    return t.timestamp() + at[1] / 1e9


def ended(pod: Any) -> bool:
    """Whether the pod's trainer container has terminated (its log is complete)."""
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.name == L.CONTAINER and cs.state is not None:
            return cs.state.terminated is not None
    return False


def fetch(core: Any, namespace: str, pod: str, mark: PodMark | None) -> tuple[bytes, float]:
    """The body of one log read (with timestamps; from `MARGIN` seconds before `mark`'s last
    line), and the API server's clock minus this machine's when it answered."""
    options: dict[str, Any] = {"container": L.CONTAINER, "timestamps": True}
    if mark is not None and mark.at is not None:
        behind = time.time() + mark.skew - _epoch(mark.at)
        options["since_seconds"] = max(1, math.ceil(behind) + MARGIN)
    resp = core.read_namespaced_pod_log(pod, namespace, _preload_content=False, **options)
    try:
        data = bytes(resp.data or b"")
        said = resp.headers.get("Date") if resp.headers is not None else None
    finally:
        resp.release_conn()
    skew = mark.skew if mark is not None else 0.0
    if said:
        with contextlib.suppress(TypeError, ValueError):
            skew = parsedate_to_datetime(said).timestamp() - time.time()
    return data, skew


def take(data: bytes, mark: PodMark | None) -> tuple[list[str], PodMark]:
    """The lines of `data` (timestamped) not read before `mark`, without their timestamps, and
    the mark after them."""
    mark = mark or PodMark()
    at, same, again, out = mark.at, mark.same, 0, []
    for raw in data.decode("utf-8", errors="replace").splitlines():
        head, _, line = raw.partition(" ")
        key = stamp(head)
        if key is None:  # no timestamp: the line as it is
            out.append(raw)
            continue
        if mark.at is not None and key < mark.at:
            continue  # asked for again by the margin: read before
        if key == mark.at and again < mark.same:
            again += 1  # one of the lines of the last timestamp read before
            continue
        out.append(line)
        at, same = (at, same + 1) if key == at else (key, 1)
    return out, replace(mark, at=at, same=same)


def logs_after(
    core: Any, namespace: str, pods: list[Any], after: dict[str, PodMark] | None
) -> LogChunk:
    """The trainer lines `pods` (oldest first) logged since `after` (None: all of them), and
    the cursor past them; `LogChunk.read` counts the bytes the API sent."""
    marks = dict(after or {})
    lines: list[str] = []
    read = 0
    for pod in pods:
        name = pod.metadata.name
        mark = marks.get(name)
        if mark is not None and mark.done:
            continue
        done = ended(pod)  # before the read: then what it returns is all there will be
        try:
            data, skew = fetch(core, namespace, name, mark)
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or its node is gone
                continue
            raise api_error(exc, f"read the logs of {name!r}") from None
        read += len(data)
        new, mark = take(data, mark)
        lines.extend(new)
        marks[name] = replace(mark, skew=skew, done=done)
    return LogChunk(lines, marks, read=read)
