"""The drain watcher: notices that this run's node is being drained when no signal comes.

On Slurm a preempted node is *drained* (state ``DRAIN``/``DRAINING``) and the job gets nothing until
the node is removed at the end of the drain window (five minutes later). The watcher is a daemon
thread that polls, every `poll_seconds`:

- ``scontrol show node $SLURMD_NODENAME`` when running under Slurm (``SLURMD_NODENAME`` set and
  ``scontrol`` on PATH): a ``State=`` containing ``DRAIN`` is a notice;
- the notice file named by ``TGNB_NOTICE_FILE`` (the local emulator writes
  ``preemption-notice.json`` there at the start of the drain window; a directory means that file
  inside it): its existence is a notice.

On the first notice it calls `on_notice(source, details)` once and stops. It never raises into the
training loop; a failing ``scontrol`` is retried at the next poll.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

NOTICE_FILE_ENV = "TGNB_NOTICE_FILE"
NOTICE_FILE_NAME = "preemption-notice.json"

NoticeHandler = Callable[[str, dict[str, Any]], None]


def notice_path(env: Mapping[str, str] | None = None) -> Path | None:
    """The notice file to watch, from ``TGNB_NOTICE_FILE`` (a file, or a directory holding one)."""
    value = (env if env is not None else os.environ).get(NOTICE_FILE_ENV)
    if not value:
        return None
    path = Path(value)
    return path / NOTICE_FILE_NAME if path.is_dir() else path


def read_notice(path: Path) -> dict[str, Any] | None:
    """The notice's content if the file exists (``{}`` when it is not a JSON object), else None."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return dict(data) if isinstance(data, dict) else {}


def node_state(node: str, timeout: float = 10.0) -> str | None:
    """The ``State=`` field of ``scontrol show node NODE``, or None when it cannot be read."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", node],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    for token in out.stdout.split():
        if token.startswith("State="):
            return token[len("State=") :]
    return None


def is_draining(state: str | None) -> bool:
    """Whether a Slurm node state (``IDLE+DRAIN``, ``MIXED+DRAIN``, ``DRAINING``...) is a drain."""
    return bool(state) and "DRAIN" in str(state).upper()


class DrainWatcher:
    """A daemon thread that calls `on_notice` once when this node's drain begins."""

    def __init__(
        self,
        on_notice: NoticeHandler,
        poll_seconds: float = 2.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = dict(os.environ if env is None else env)
        self.on_notice = on_notice
        self.poll_seconds = max(0.05, float(poll_seconds))
        self.notice_file = notice_path(env)
        node = env.get("SLURMD_NODENAME")
        self.node = node if node and shutil.which("scontrol", path=env.get("PATH")) else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """Whether there is anything to watch (a Slurm node or a notice file)."""
        return self.node is not None or self.notice_file is not None

    def check(self) -> tuple[str, dict[str, Any]] | None:
        """Poll once: ``(source, details)`` of a notice, or None."""
        if self.notice_file is not None:
            notice = read_notice(self.notice_file)
            if notice is not None:
                return "notice-file", {"path": str(self.notice_file), "notice": notice}
        if self.node is not None:
            state = node_state(self.node)
            if is_draining(state):
                return "scontrol", {"node": self.node, "state": state}
        return None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.check()
            except Exception:  # never let a poll error kill the watcher
                found = None
            if found is not None:
                self.on_notice(*found)
                return
            self._stop.wait(self.poll_seconds)

    def start(self) -> DrainWatcher:
        if self.active and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="tgnb-drain-watcher", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_seconds + 11)
