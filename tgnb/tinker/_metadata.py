"""``user_metadata`` of saved checkpoints (tinker 0.38's ``save_state`` /
``save_weights_for_sampler`` take it): Post-Training's checkpoints carry no metadata, so this
layer keeps it on the client's machine, one JSON file per checkpoint id under
``<tgnb home>/posttraining/checkpoint-metadata/``, where `metadata_of` reads it back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tgnb.connection import Endpoint
from tgnb.tinker._paths import checkpoint_id


def _folder(conn: Endpoint) -> Path:
    return Path(conn.home) / "posttraining" / "checkpoint-metadata"


def check(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """`metadata` as Tinker takes it (str keys and values), else a one-line error."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TypeError("user_metadata must be a dict of str to str")
    return dict(metadata)


def keeper(conn: Endpoint, metadata: dict[str, str] | None) -> Callable[[Any], Any]:
    """A function of a save's response that records `metadata` for its checkpoint, then answers
    the response (nothing is written without metadata)."""

    def keep(response: Any) -> Any:
        if metadata:
            folder = _folder(conn)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{checkpoint_id(response.path)}.json"
            path.write_text(json.dumps(metadata, sort_keys=True))
        return response

    return keep


def metadata_of(conn: Endpoint, path: str) -> dict[str, str] | None:
    """The ``user_metadata`` saved with checkpoint `path` (a ``tinker://`` path or an id) on this
    machine, or None."""
    file = _folder(conn) / f"{checkpoint_id(path)}.json"
    try:
        return dict(json.loads(file.read_text()))
    except FileNotFoundError:
        return None
