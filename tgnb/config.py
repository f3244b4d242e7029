"""Configuration, read in one place.

Environment variables: ``TOGETHER_API_KEY``, ``TOGETHER_PROJECT_ID``, ``TOGETHER_BASE_URL`` (what the
official SDK reads too) and ``TGNB_HOME`` (default ``~/.tgnb``), where the emulator daemon keeps its
pid, port, log and state and where the run store lives.

The API key is held in a `Secret` whose repr never shows it, and every error message is scrubbed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

_SECRETS: set[str] = set()
#: Every `PIECE_CHARS`-character piece of every registered secret (less its public head).
_PIECES: set[str] = set()

#: A piece of a secret this long anywhere in a text is masked (a cut message keeps a piece).
PIECE_CHARS = 8
#: A run of this many leading characters of a secret is masked too, its public head included.
PREFIX_CHARS = 12
#: A key's public head: words and separators that say what kind of key it is (``tgp_v1_``,
#: ``tgnb-emu-``, ``hf_``), at most 10 characters; a piece lying wholly inside it is no secret.
_HEAD = re.compile(r"^(?:[A-Za-z0-9]{1,8}[-_])+")


def register_secret(value: str | None) -> None:
    """Remember a secret so that `scrub` removes it from any text tgnb shows."""
    if value and len(value) >= 4:
        _SECRETS.add(value)
        head = _HEAD.match(value)
        skip = len(head.group(0)) if head and len(head.group(0)) <= 10 else 0
        for i in range(len(value) - PIECE_CHARS + 1):
            if i + PIECE_CHARS > skip:
                _PIECES.add(value[i : i + PIECE_CHARS])


def scrub(text: str) -> str:
    """Replace every registered secret in `text`, any run of its first `PREFIX_CHARS` or more
    characters, and any piece of `PIECE_CHARS` or more characters of it, with ``***``."""
    text = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
        head = secret[:PREFIX_CHARS]
        if len(secret) > PREFIX_CHARS and head in text:
            text = _mask_prefixes(text, secret)
    return _mask_pieces(text) if _PIECES else text


def _mask_pieces(text: str) -> str:
    """Every character of `text` covered by a piece of a secret, each run of them as one ``***``."""
    n = PIECE_CHARS
    covered = [False] * len(text)
    for i in range(len(text) - n + 1):
        if text[i : i + n] in _PIECES:
            covered[i : i + n] = [True] * n
    if not any(covered):
        return text
    out, i = [], 0
    while i < len(text):
        if covered[i]:
            out.append("***")
            while i < len(text) and covered[i]:
                i += 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _mask_prefixes(text: str, secret: str) -> str:
    head, out, i = secret[:PREFIX_CHARS], [], 0
    while (j := text.find(head, i)) >= 0:
        n = PREFIX_CHARS
        while n < len(secret) and j + n < len(text) and text[j + n] == secret[n]:
            n += 1
        out.append(text[i:j] + "***")
        i = j + n
    return "".join(out) + text[i:]


#: Names of environment variables that hold secrets by their look (``WANDB_API_KEY``, ``HF_TOKEN``,
#: ``DB_PASSWORD``, ``AWS_SECRET_ACCESS_KEY``): refused in a run's plain `env` by every engine.
SECRET_NAME = re.compile(
    r"(?:^|_)TOKEN(?:_|$)|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|SECRET|PASSWORD|PASSWD", re.IGNORECASE
)


def looks_secret(name: str) -> bool:
    """Whether the environment variable `name` looks like it holds a secret (`SECRET_NAME`)."""
    return bool(SECRET_NAME.search(name))


def holds_secret(value: object) -> bool:
    """Whether `value` (a string, or a mapping or list of them) holds a registered secret or a
    long prefix of one."""
    if isinstance(value, str):
        return scrub(value) != value
    if isinstance(value, dict):
        return any(holds_secret(k) or holds_secret(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(holds_secret(v) for v in value)
    return False


#: Environment variables whose values are secrets wherever they appear.
SECRET_ENV = ("TOGETHER_API_KEY", "TGNB_EMULATOR_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def register_env_secrets() -> None:
    """Register the values of `SECRET_ENV` set in this process's environment."""
    for name in SECRET_ENV:
        register_secret(os.environ.get(name))


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


#: Set for the kernels a command starts (``tgnb notebooks run``): a local emulator they start is
#: that command's, which it may restart with other options and stop (`tgnb.emulator.daemon`).
EMULATOR_OWNER_ENV = "TGNB_EMULATOR_OWNER"


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
