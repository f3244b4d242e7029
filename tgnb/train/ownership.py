"""A checkpoint directory belongs to one run: its identity in every manifest, a lock while it lives.

Two runs pointed at one directory (two scripts with the same ``output_dir``, two
``Checkpointer(dir=...)``) would otherwise share it silently: the second resumes the first's live
checkpoint with its own seed and learning rate, the two overwrite each other's saves, and both
exit 0. So:

- **A lock while live** (`Claim`): rank 0 holds an exclusive ``flock`` on ``LOCK`` in the
  checkpoints directory from the choice of where to resume until the run ends (`Claim.release`,
  or the process's exit: a preempted or killed run leaves no stale lock). Another run that finds it
  held is refused (`CheckpointError`) naming the holder (run, pid, host) and the fix. ``flock`` is
  advisory and, on some network filesystems, local to one host: it guards the runs of one machine
  (or of a filesystem that honours it), the identity below guards the rest.
- **Its identity in the manifest** (`identity`): the run's name when tgnb launched it (outside
  tgnb the name is the directory's, and a directory copied elsewhere is the same run), and what
  makes it another run -- its seed and learning rate where the program has them. Each checkpoint's marker records it
  (``owner``); a run whose identity differs from the newest checkpoint's is refused with the fix
  instead of resuming it. The same program run again has the same identity and resumes. A marker
  without an owner (written before this rule) is resumed as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from tgnb.errors import CheckpointError

#: The lock file in a checkpoints directory (not a checkpoint: retention and resume ignore it).
LOCK = ".tgnb-owner.lock"
_FIX = (
    "give this run its own directory (output_dir= for a Trainer, dir= for a Checkpointer, or "
    "another run name), or remove {dir} to start it over"
)


def identity(name: str | None, **facts: Any) -> dict[str, Any]:
    """The identity of a run: its name (None: not known, outside tgnb) and the `facts` given that
    are not None (JSON values)."""
    out: dict[str, Any] = {} if name is None else {"run": str(name)}
    for key, value in facts.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, int | float | str | bool) else str(value)
    return out


def _describe(owner: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in owner.items()) or "unknown"


def check_owner(ckpt_dir: Path, saved: object, mine: dict[str, Any]) -> str:
    """Why this run (`mine`) may not resume a checkpoint whose marker's owner is `saved` ("" when
    it may: the same identity, or a marker without one). Only the facts both name are compared."""
    if not isinstance(saved, dict):
        return ""
    differ = [k for k in mine if k in saved and saved[k] != mine[k]]
    if not differ:
        return ""
    return (
        f"the checkpoints in {ckpt_dir} belong to another run ({_describe(saved)}; this run: "
        f"{_describe(mine)}): " + _FIX.format(dir=ckpt_dir)
    )


#: This process's locks by directory: [descriptor, holders]. A process is one run to the others;
#: within it a directory claimed again (a notebook cell run twice, a restart in a test) shares
#: the lock, dropped when its last holder releases it.
_HELD: dict[str, list[int]] = {}


class Claim:
    """Rank 0's hold on a checkpoints directory (`claim`)."""

    def __init__(self, key: str) -> None:
        self._key: str | None = key

    def release(self) -> None:
        """Give the directory back (idempotent)."""
        key, self._key = self._key, None
        held = _HELD.get(key) if key is not None else None
        if key is None or held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _HELD[key]
            with contextlib.suppress(OSError):
                os.close(held[0])  # closing the descriptor drops the flock

    def __del__(self) -> None:
        self.release()


def claim(ckpt_dir: Path, mine: dict[str, Any]) -> Claim:
    """Lock `ckpt_dir` for this run (created if need be), recording who holds it; a
    `CheckpointError` naming the holder and the fix when another live run does."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    key = str(ckpt_dir.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        return Claim(key)
    fd = os.open(ckpt_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder: Any = {}
        with contextlib.suppress(OSError, ValueError):
            holder = json.loads(os.pread(fd, 65536, 0).decode("utf-8", "replace"))
        os.close(fd)
        who = _describe(holder) if isinstance(holder, dict) else "unknown"
        raise CheckpointError(
            f"{ckpt_dir} is in use by another live run ({who}): " + _FIX.format(dir=ckpt_dir)
        ) from None
    except BaseException:
        os.close(fd)
        raise
    record = {**mine, "pid": os.getpid(), "host": socket.gethostname()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record, sort_keys=True).encode(), 0)
    _HELD[key] = [fd, 1]
    return Claim(key)
