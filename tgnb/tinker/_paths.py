"""Tinker's checkpoint paths over Post-Training checkpoint ids.

Tinker names a checkpoint ``tinker://<training_run_id>/weights/<name>`` (``save_state``: weights
and optimizer state) or ``tinker://<training_run_id>/sampler_weights/<name>``
(``save_weights_for_sampler``), and the cookbook parses them (``ParsedCheckpointTinkerPath``).
Post-Training gives a checkpoint a server-assigned id and no name, under the session that took
it, so this layer writes ``tinker://<session id>/weights/<training checkpoint id>`` and
``tinker://<session id>/sampler_weights/<inference checkpoint id>``: the training run is the
session (what ``get_info().model_id`` answers), the name is the id. It reads those paths back,
and the bare ids it answered before (old code and stored paths keep working).
"""

from __future__ import annotations

from typing import Any, Literal

from together.post_training.tinker import types

from tgnb.errors import ValidationError

CKPT_TRAINING = "CHECKPOINT_TYPE_TRAINING"
CKPT_INFERENCE = "CHECKPOINT_TYPE_INFERENCE"

#: Post-Training's checkpoint type -> (Tinker's checkpoint type, the path's middle part).
KINDS: dict[str, tuple[Literal["training", "sampler"], str]] = {
    CKPT_TRAINING: ("training", "weights"),
    CKPT_INFERENCE: ("sampler", "sampler_weights"),
}


def tinker_path(session_id: str, checkpoint_type: str, checkpoint_id: str) -> str:
    """The ``tinker://`` path of checkpoint `checkpoint_id` of type `checkpoint_type`."""
    return f"tinker://{session_id}/{KINDS[checkpoint_type][1]}/{checkpoint_id}"


def checkpoint_id(path: Any) -> str:
    """The Post-Training checkpoint id that `path` (a ``tinker://`` path or a bare id) names."""
    if isinstance(path, str) and path and "/" not in path and ":" not in path:
        return path
    try:
        parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(path)
    except (ValueError, AttributeError, TypeError):
        raise ValidationError(
            f"{path!r} is not a checkpoint path: pass the .path that save_state() or "
            "save_weights_for_sampler() returned (tinker://<run>/weights/<id>, "
            "tinker://<run>/sampler_weights/<id>, or the bare id)"
        ) from None
    return parsed.checkpoint_id.split("/", 1)[1]


def with_path(session_id: str, checkpoint_type: str, response: Any) -> Any:
    """A save's `response` with its ``path`` (the SDK's bare id) as a ``tinker://`` path."""
    return response.model_copy(
        update={"path": tinker_path(session_id, checkpoint_type, response.path)}
    )
