"""The durable local record of every Post-Training model resource tgnb creates (through
`tgnb.tinker`, `tgnb.posttraining` and ``%tg pt``), so that no interrupted process leaves one
billing unseen.

- `store`: one file per resource under ``<tgnb home>/posttraining/resources/``, written before
  the create is sent and keyed by its idempotency key; the holder's pid and start time.
- `create`: the create itself (the key as ``Idempotency-Key``, a read-back instead of a blind
  resend, the wait for READY, a stop on any interruption) with a default inactivity timeout
  (`DEFAULT_INACTIVE_TIMEOUT`, ``$TGNB_PT_INACTIVE_TIMEOUT``).
- `leftovers`: resources still active whose holder is gone, their cost from the platform's own
  numbers, and their stop (``tgnb pt stop --leftovers``).

It sits below the Post-Training client and the Tinker layer, which both use it, and imports
the SDK only inside functions.
"""

from __future__ import annotations

from tgnb.ptregistry.create import (
    DEFAULT_INACTIVE_TIMEOUT,
    TIMEOUT_ENV,
    create,
    default_inactive_timeout,
    stop_mine,
)
from tgnb.ptregistry.leftovers import STOP_HINT, Billed, Leftover, billed, describe, find, lines
from tgnb.ptregistry.leftovers import stop as stop_leftovers
from tgnb.ptregistry.store import Entry, Registry, mine

__all__ = [
    "DEFAULT_INACTIVE_TIMEOUT",
    "STOP_HINT",
    "TIMEOUT_ENV",
    "Billed",
    "Entry",
    "Leftover",
    "Registry",
    "billed",
    "create",
    "default_inactive_timeout",
    "describe",
    "find",
    "lines",
    "mine",
    "stop_leftovers",
    "stop_mine",
]
