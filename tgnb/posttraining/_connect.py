"""Where the Post-Training API answers and with which key: a `tgnb.connection.Endpoint` (its SDK
keywords, client and error translation are the endpoint's own).

`connect` finds where the API answers through `tgnb.connection` (the default `tgnb.attach` shares:
the local emulator when no ``TOGETHER_API_KEY`` is set, else Together; ``local=True`` the
emulator, ``local=False`` Together as the SDK reads its environment). ``together`` is imported
inside functions, so ``import tgnb`` stays light.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tgnb import connection
from tgnb.cloud.client import DEFAULT_BASE_URL, normalize_base_url
from tgnb.config import register_secret
from tgnb.connection import Endpoint


def connect(
    local: bool | None = None, *, home: str | Path | None = None, time_scale: float | None = None
) -> Endpoint:
    """The `Endpoint` of the local emulator (started if needed) or of the real service
    (`tgnb.connection.connect`: the same default as `tgnb.attach`), its API root without
    ``/v1`` (the SDK's default when none is set)."""
    end = connection.connect(local, home=home, time_scale=time_scale)
    assert end.api_key is not None  # connect refuses a missing key
    if end.emulator is None:
        register_secret(end.api_key.get())
    return replace(end, base_url=normalize_base_url(end.base_url) or DEFAULT_BASE_URL)


def status_label(status: str | None) -> str:
    """``MODEL_RESOURCES_STATUS_READY`` -> ``READY``."""
    if not status:
        return "-"
    for prefix in (
        "MODEL_RESOURCES_STATUS_",
        "TRAINING_SESSION_STATUS_",
        "TRAINING_OPERATION_STATUS_",
        "CHECKPOINT_TYPE_",
    ):
        if status.startswith(prefix):
            return status[len(prefix) :]
    return status


__all__ = ["connect"]


def download(conn: Endpoint, checkpoint_id: str, variant: str, out: Path) -> list[Path]:
    """The SDK's ``download_checkpoint`` into `out` (checked: id, variant, directory)."""
    from together.post_training import download_checkpoint

    return conn.call(
        lambda: download_checkpoint(
            conn.sdk(),
            checkpoint_id,
            variant=variant,  # type: ignore[arg-type]
            output_dir=out,
        ),
        f"download checkpoint {checkpoint_id}",
    )
