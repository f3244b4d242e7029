"""Configuration, read in one place.

Environment variables: ``TOGETHER_API_KEY``, ``TOGETHER_PROJECT_ID``, ``TOGETHER_BASE_URL`` (what the
official SDK reads too) and ``TGNB_HOME`` (default ``~/.tgnb``), where the emulator daemon keeps its
pid, port, log and state and where the run store lives.

The API key is held in a `Secret` whose repr never shows it, and every error message is scrubbed.

What counts as a secret in a text (`scrub`, `holds_secret`)
-----------------------------------------------------------
A registered secret is found in three forms: whole; a run of its first `PREFIX_CHARS` (12) or more
characters (a message cut after ``Bearer tgp_v1_abcde``); and any `PIECE_CHARS` (8) characters of
its **random part** (a message cut at both ends, a key pasted into a longer value).

The random part (`random_part`) is the secret less its leading and trailing *words*: split at
every character that is not a letter or digit, a word is 2-12 letters in one case or capitalized
(``tgnb``, ``test``, ``FAKE``, ``Secret``) or a version tag (``v1``); the random part runs from the
first segment that is not a word to the end of the last one. So the public heads ``tgnb-``,
``tgnb-test-``, ``tgnb-emu-``, ``tgp_v1_``, ``sk-live-``, ``hf_`` and mnemonic tails (``-key``,
``-token-value``) give no pieces, and a test key made only of words (``tgnb-test-restart-key``)
gives none at all (it is found whole or by its prefix). Why this rule and not the others weighed:

- Pieces of any 8 characters less a head of at most 10 (the rule before) made ordinary text a
  secret: ``tgnb-tes`` of a test key in the model id ``tgnb-test-owner/model`` and ``-restart``
  in the run name ``through-restart`` refused run configs ("the training config holds a secret
  value") and masked words as ``***``. What such text shares with a key is its public words,
  never its random part.
- A fixed 8 characters of the random part, not a length relative to the secret's: a key's
  strength is per random character (8 base64 characters are 48 bits, 8 hex 32), so text matching
  one by chance is as rare in a long key as in a short one, while half of a 40-character key would
  let a 10-character leak through (the catalogue's ``key-middle-10``).
- No demand that a piece mix letters and digits or hold many distinct characters: a random part is
  random, and such floors would open holes in it (``efghijkl`` of the catalogue's key, or an 8-hex
  window that happens to repeat characters) to save nothing real keys contain.
- The prefix rule stays as it was: 12 leading characters of exactly the key are specific enough,
  and a cut message keeps just those (``tgp_FAKE_SEC`` in the catalogue lies wholly in the head).

What counts as a secret value at all (`counts_as_secret`): at least `MIN_SECRET_CHARS` (8)
characters, not one character repeated (``********``) and not a single word (``none``, ``null``,
``changeme``, ``placeholder``: `_WORD`). A placeholder such as ``HF_TOKEN=none`` in the
environment is no secret: registered, it refused ``report_to: none`` and masked ``nonexistent``
as ``***xistent``. Real keys are longer and mix cases, digits or segments.

Limits: a random part under 8 characters gives no pieces (``hf_Zx9-this-is-the-token-value`` is
found whole or by its prefix only); a word-like segment at an end of a generated part (``ab`` in
``tgnb-emu-ab-X...``) is left out of it; text beginning with the first 12 characters of a key made
of words (``tgnb-test-re`` of ``tgnb-test-restart-key``) is still masked.

The registry is one `Scrubber` per process (`register_secret`, `scrub`, `holds_secret` use it); a
test that needs a registry of its own makes a `Scrubber`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: This many characters of a secret's random part anywhere in a text are masked.
PIECE_CHARS = 8
#: A run of this many leading characters of a secret is masked too, its public head included.
PREFIX_CHARS = 12
#: A value shorter than this is never a secret (a placeholder such as ``none``, ``xxx``).
MIN_SECRET_CHARS = 8
_SEGMENT = re.compile(r"[A-Za-z0-9]+")
_WORD = re.compile(r"[a-z]{2,12}|[A-Z]{2,12}|[A-Z][a-z]{1,11}|v[0-9]{1,3}")


def random_part(secret: str) -> str:
    """`secret` less its leading and trailing words (see the module's docstring); ``""`` when it
    is made of words only."""
    if not _SEGMENT.search(secret):  # no letter or digit at all: nothing public to leave out
        return secret
    spans = [m.span() for m in _SEGMENT.finditer(secret) if not _WORD.fullmatch(m.group())]
    return secret[spans[0][0] : spans[-1][1]] if spans else ""


def counts_as_secret(value: str | None) -> bool:
    """Whether `value` can be a secret: `MIN_SECRET_CHARS` or more characters, not one character
    repeated, not a single word (a placeholder: ``none``, ``changeme``)."""
    if not value or len(value) < MIN_SECRET_CHARS or len(set(value)) == 1:
        return False
    return not _WORD.fullmatch(value)


class Scrubber:
    """The registered secrets and the pieces of their random parts."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self.pieces: set[str] = set()

    def register(self, value: str | None) -> None:
        """Remember a secret so that `scrub` removes it; a value that cannot be one
        (`counts_as_secret`: a placeholder such as ``none``) is passed over."""
        if value and counts_as_secret(value):
            self.secrets.add(value)
            body = random_part(value)
            for i in range(len(body) - PIECE_CHARS + 1):
                self.pieces.add(body[i : i + PIECE_CHARS])

    def scrub(self, text: str) -> str:
        """`text` with every registered secret, any run of its first `PREFIX_CHARS` or more
        characters, and any `PIECE_CHARS` characters of its random part replaced by ``***``."""
        text = str(text)
        ordered = sorted(self.secrets, key=len, reverse=True)
        for secret in ordered:  # whole secrets first: another's prefix must not cut one in two
            if secret in text:
                text = text.replace(secret, "***")
        for secret in ordered:
            if len(secret) > PREFIX_CHARS and secret[:PREFIX_CHARS] in text:
                text = _mask_prefixes(text, secret)
        return self._mask_pieces(text) if self.pieces else text

    def holds(self, value: object) -> bool:
        """Whether `value` (a string, or a mapping or list of them) holds a secret in any of the
        three forms."""
        if isinstance(value, str):
            return self.scrub(value) != value
        if isinstance(value, dict):
            return any(self.holds(k) or self.holds(v) for k, v in value.items())
        if isinstance(value, list | tuple):
            return any(self.holds(v) for v in value)
        return False

    def in_bytes(self, data: bytes) -> bool:
        """Whether `data` (a file's bytes) holds a registered secret whole, or its random part
        when that is 16 characters or more (the shorter pieces are for text shown)."""
        for secret in self.secrets:
            body = random_part(secret)
            if secret.encode() in data or (len(body) >= 16 and body.encode() in data):
                return True
        return False

    def _mask_pieces(self, text: str) -> str:
        """Every character of `text` covered by a piece, each run of them as one ``***``."""
        n = PIECE_CHARS
        covered = [False] * len(text)
        for i in range(len(text) - n + 1):
            if text[i : i + n] in self.pieces:
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


_SCRUBBER = Scrubber()


def register_secret(value: str | None) -> None:
    """Remember a secret so that `scrub` removes it from any text tgnb shows."""
    _SCRUBBER.register(value)


def scrub(text: str) -> str:
    """`text` with every registered secret masked (`Scrubber.scrub`)."""
    return _SCRUBBER.scrub(text)


def holds_secret(value: object) -> bool:
    """Whether `value` (a string, or a mapping or list of them) holds a registered secret, a long
    prefix of one or a piece of its random part."""
    return _SCRUBBER.holds(value)


def holds_secret_bytes(data: bytes) -> bool:
    """Whether `data` holds a registered secret (`Scrubber.in_bytes`)."""
    return _SCRUBBER.in_bytes(data)


#: Names of environment variables that hold secrets by their look (``WANDB_API_KEY``, ``HF_TOKEN``,
#: ``DB_PASSWORD``, ``AWS_SECRET_ACCESS_KEY``): refused in a run's plain `env` by every engine.
SECRET_NAME = re.compile(
    r"(?:^|_)TOKEN(?:_|$)|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|SECRET|PASSWORD|PASSWD", re.IGNORECASE
)


def looks_secret(name: str) -> bool:
    """Whether the environment variable `name` looks like it holds a secret (`SECRET_NAME`)."""
    return bool(SECRET_NAME.search(name))


#: Keys of a training config whose string values hold secrets by their name (``trl.hub_token``,
#: ``push_to_hub_token``, ``wandb_api_key``, ``s3_secret_key``, ``db_password``): `SECRET_NAME`, and
#: any key ending in ``_token`` or ``_key``, except a tokenizer's special tokens (``pad_token``,
#: ``eos_token``: text such as ``<|endoftext|>``, no credential).
SECRET_KEY = re.compile(r"(?:^|_)(?:token|key)$|^(?:token|key)$", re.IGNORECASE)
_SPECIAL_TOKEN = re.compile(
    r"(?:pad|eos|bos|unk|sep|cls|mask|additional_special|special)_tokens?$", re.IGNORECASE
)


def looks_secret_key(key: str) -> bool:
    """Whether the config key `key` names a secret (`SECRET_KEY`, `SECRET_NAME`)."""
    if _SPECIAL_TOKEN.search(key):
        return False
    return bool(SECRET_KEY.search(key) or SECRET_NAME.search(key))


def secret_keys(config: object, path: str = "") -> list[str]:
    """The dotted paths of `config` (mappings and lists walked) whose key names a secret and whose
    value is a non-empty string (`looks_secret_key`): ``["trl.hub_token"]``."""
    found: list[str] = []
    if isinstance(config, dict):
        for key, value in config.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and looks_secret_key(key) and isinstance(value, str) and value:
                found.append(where)
            else:
                found += secret_keys(value, where)
    elif isinstance(config, list | tuple):
        for i, value in enumerate(config):
            found += secret_keys(value, f"{path}[{i}]")
    return found


#: Environment variables whose values are secrets wherever they appear.
SECRET_ENV = ("TOGETHER_API_KEY", "TGNB_EMULATOR_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def register_env_secrets() -> None:
    """Register the values of `SECRET_ENV` set in this process's environment."""
    for name in SECRET_ENV:
        register_secret(os.environ.get(name))


#: Set by every engine on a node: the names of the run's declared ``secrets`` (comma-separated),
#: whose values the node masks in what it writes (`register_node_secrets`). Names only, no value.
MASK_VARS_ENV = "TGNB_MASK_VARS"


def register_node_secrets(environ: Mapping[str, str] | None = None) -> None:
    """Register, on a node, the values of the run's declared secrets (`MASK_VARS_ENV`), of
    `SECRET_ENV` and of every variable whose name looks like a secret's (`looks_secret`:
    ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``), so that what the node writes (events, metrics,
    tracebacks) is masked where it is written (`tgnb.train.record.Recorder`)."""
    env = os.environ if environ is None else environ
    declared = {n.strip() for n in env.get(MASK_VARS_ENV, "").split(",") if n.strip()}
    for name, value in env.items():
        if name != MASK_VARS_ENV and (name in declared or name in SECRET_ENV or looks_secret(name)):
            register_secret(value)


def scrub_record(value: Any) -> Any:
    """`value` (a record: mappings, lists and strings) with every string `scrub`bed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {k: scrub_record(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_record(v) for v in value]
    return value


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

#: Platform time runs this many times faster on a local emulator (300 s -> 6 s): provisioning,
#: drain windows and Post-Training's inactivity timeouts alike. The one default of
#: ``tgnb emulator start`` and of ``%tg attach --local`` / ``tgnb.attach(local=True)``.
DEFAULT_TIME_SCALE = 0.02


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
