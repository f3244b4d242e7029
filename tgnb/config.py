"""Configuration, read in one place.

Environment variables: ``TOGETHER_API_KEY``, ``TOGETHER_PROJECT_ID``, ``TOGETHER_BASE_URL`` (what the
official SDK reads too) and ``TGNB_HOME`` (default ``~/.tgnb``), where the emulator daemon keeps its
pid, port, log and state and where the run store lives.

The API key is held in a `Secret` whose repr never shows it, and every error message is scrubbed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a secret so that `scrub` removes it from any text tgnb shows."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def scrub(text: str) -> str:
    """Replace every registered secret in `text` with ``***``."""
    for secret in _SECRETS:
        if secret in text:
            text = text.replace(secret, "***")
    return text


class Secret:
    """A string that does not show itself in repr, str or logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        register_secret(value)

    def get(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def default_home() -> Path:
    return Path(os.environ.get("TGNB_HOME") or Path.home() / ".tgnb").expanduser()


@dataclass(frozen=True)
class Settings:
    """What tgnb needs from the environment. Build it with `Settings.from_env()`."""

    api_key: Secret | None = None
    project_id: str | None = None
    base_url: str | None = None
    home: Path = field(default_factory=default_home)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        key = env.get("TOGETHER_API_KEY") or None
        home = env.get("TGNB_HOME")
        return cls(
            api_key=Secret(key) if key else None,
            project_id=env.get("TOGETHER_PROJECT_ID") or None,
            base_url=env.get("TOGETHER_BASE_URL") or None,
            home=Path(home).expanduser() if home else Path.home() / ".tgnb",
        )

    def ensure_home(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        return self.home
