"""Fixtures of the session tests: the local engine's (a real emulator daemon, a `tgnb.Session`
attached to a cluster on it, the stand-in trainer, clean-up of every process a test started)."""

from __future__ import annotations

from ..backends.local.conftest import (
    HERE,
    emu,
    make_session,
    session,
    standin,
    stop_everything,
)

__all__ = ["HERE", "emu", "make_session", "session", "standin", "stop_everything"]
