"""A job's whole process tree, without cgroups: what the local backend kills so that nothing of a
job survives its kill.

torchrun starts each worker in a session of its own, so a signal to the agent's process group does
not reach the workers, and once the agent is gone they are orphans that no tree walk from it finds.
So every process of a run is tagged: its environment carries ``TGNB_PROCESS_TAG=<run id>:<attempt>``
(inherited by every process it starts, torchrun's workers included), and `kill_tagged` signals every
process whose environment (``/proc/<pid>/environ``) holds the run's tag, as well as the descendants
(by parent pid) of the given roots, until none is left. Linux only (``/proc``); elsewhere only the
roots' process groups are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

TAG_ENV = "TGNB_PROCESS_TAG"
_PROC = Path("/proc")


def tag(run_id: str, attempt: int) -> str:
    return f"{run_id}:{attempt}"


def _live(stat_text: str) -> tuple[int, str] | None:
    """(ppid, state) from a ``/proc/<pid>/stat`` text, or None."""
    try:
        fields = stat_text.rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]
    except (IndexError, ValueError):
        return None


def members(run_id: str, roots: Iterable[int] = ()) -> set[int]:
    """The live (not zombie) processes of the run `run_id`: those tagged with it, the `roots` and
    all their descendants. Never this process."""
    prefix = f"{TAG_ENV}={run_id}:".encode()
    parents: dict[int, int] = {}
    found: set[int] = set()
    me = os.getpid()
    if not _PROC.is_dir():
        return set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            got = _live((entry / "stat").read_text())
            if got is None or got[1] in ("Z", "X"):
                continue
            parents[pid] = got[0]
            if pid != me and any(
                v.startswith(prefix) for v in (entry / "environ").read_bytes().split(b"\0")
            ):
                found.add(pid)
        except OSError:  # gone, or another user's
            continue
    todo = [r for r in roots if r in parents]
    found.update(todo)
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(me)
    return found


def signal_run(run_id: str, roots: Iterable[int], sig: int) -> set[int]:
    """Send `sig` to every process of the run (`members`) and to the roots' process groups; the
    pids signalled."""
    roots = list(roots)
    for pgid in roots:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    pids = members(run_id, roots)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return pids


def kill_run(run_id: str, roots: Iterable[int] = (), timeout: float = 5.0) -> int:
    """SIGKILL every process of the run, again until none is left (a process may start one while
    it is being killed) or `timeout` s; how many were killed."""
    roots = list(roots)
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        got = signal_run(run_id, roots, signal.SIGKILL)
        killed |= got
        if not got or time.monotonic() > deadline:
            return len(killed)
        roots = []
        time.sleep(0.02)
