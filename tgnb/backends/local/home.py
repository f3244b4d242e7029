"""The home's emulator as a run's supervisor sees it: where to reach it (its daemon's files, else
the environment), and whether it was stopped on purpose (`tgnb emulator stop`), in which case the
supervisor stops its run and exits rather than outlive the platform it plays."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

#: Seconds the home's emulator may stay stopped (no ``server.json``: a restart takes a few) before
#: the supervisor stops its run and exits.
EMULATOR_GONE_S = 20.0
EMULATOR_STOPPED = "stopped with the local emulator (tgnb emulator stop); launch it again to resume"


def endpoint_for(home: Path) -> Any:
    """A callable giving the emulator's (base_url, key): the daemon's files, else the environment."""

    def endpoint() -> tuple[str, str | None]:
        try:
            from tgnb.backends.local.backend import emulator_endpoint

            found = emulator_endpoint(home)
        except Exception:
            found = None
        if found is not None:
            return found
        return os.environ.get("TOGETHER_BASE_URL", ""), os.environ.get("TOGETHER_API_KEY")

    return endpoint


class HomeEmulator:
    """Whether the emulator daemon of tgnb home `home` was stopped on purpose: it was found through
    the home's files once, and its ``server.json`` has been missing for `grace` seconds since
    (``tgnb emulator stop`` removes it; a killed daemon leaves it, and is expected back)."""

    def __init__(self, home: Path, grace: float = EMULATOR_GONE_S) -> None:
        from tgnb.emulator.daemon import emulator_home

        self.server_file = emulator_home(home) / "server.json"
        self.grace = grace
        self.seen = self.server_file.exists()
        self.missing_since: float | None = None

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.server_file.exists():
            self.seen, self.missing_since = True, None
            return False
        if not self.seen:
            return False  # this home never had a daemon: the environment names the emulator
        if self.missing_since is None:
            self.missing_since = now
        return now - self.missing_since >= self.grace
