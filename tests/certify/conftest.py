"""Fixtures of the certify tests: the local engine's (a real emulator daemon, a session on it)."""

from __future__ import annotations

from ..backends.local.conftest import emu, session

__all__ = ["emu", "session"]
