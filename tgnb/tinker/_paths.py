"""Tinker's checkpoint paths over Post-Training checkpoint ids.

Tinker names a checkpoint ``tinker://<training_run_id>/weights/<name>`` (``save_state``: weights
and optimizer state) or ``tinker://<training_run_id>/sampler_weights/<name>``
(``save_weights_for_sampler``), since 0.38 also ``tinker://<training_run_id>/external_weights/
<name>`` (``save_weights_external``), and the cookbook parses them (``ParsedCheckpointTinkerPath``:
0.38's, which knows the third kind, is `ParsedCheckpointTinkerPath` here).
Post-Training gives a checkpoint a server-assigned id and no name, under the session that took
it, so this layer writes ``tinker://<session id>/weights/<training checkpoint id>`` and
``tinker://<session id>/sampler_weights/<inference checkpoint id>`` (``external_weights`` for
``save_weights_external``: an inference checkpoint too): the training run is the
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
EXTERNAL = "external_weights"
_TYPES = {"weights": "training", "sampler_weights": "sampler", EXTERNAL: "external"}


class ParsedCheckpointTinkerPath(types.ParsedCheckpointTinkerPath):
    """Tinker 0.38's parse of a checkpoint path: ``weights``, ``sampler_weights`` and
    ``external_weights`` (type ``external``); 0.23.1's refuses the third."""

    checkpoint_type: Literal["training", "sampler", "external"]  # type: ignore[assignment, unused-ignore]

    @classmethod
    def from_tinker_path(cls, tinker_path: str) -> ParsedCheckpointTinkerPath:
        parts = tinker_path.removeprefix("tinker://").split("/")
        if not tinker_path.startswith("tinker://") or len(parts) != 3 or parts[1] not in _TYPES:
            raise ValueError(f"Invalid tinker path: {tinker_path}")
        return cls(
            tinker_path=tinker_path,
            training_run_id=parts[0],
            checkpoint_type=_TYPES[parts[1]],  # type: ignore[arg-type]
            checkpoint_id="/".join(parts[1:]),
        )


def path_of(session_id: str, kind: str, checkpoint_id: str) -> str:
    """``tinker://<session>/<kind>/<id>``: `kind` is the middle part (``weights``,
    ``sampler_weights``, ``external_weights``)."""
    return f"tinker://{session_id}/{kind}/{checkpoint_id}"


def tinker_path(session_id: str, checkpoint_type: str, checkpoint_id: str) -> str:
    """The ``tinker://`` path of checkpoint `checkpoint_id` of Post-Training type
    `checkpoint_type`."""
    return path_of(session_id, KINDS[checkpoint_type][1], checkpoint_id)


def checkpoint_id(path: Any) -> str:
    """The Post-Training checkpoint id that `path` (a ``tinker://`` path or a bare id) names."""
    if isinstance(path, str) and path and "/" not in path and ":" not in path:
        return path
    try:
        parsed = ParsedCheckpointTinkerPath.from_tinker_path(path)
    except (ValueError, AttributeError, TypeError):
        raise ValidationError(
            f"{path!r} is not a checkpoint path: pass the .path that save_state() or "
            "save_weights_for_sampler() returned (tinker://<run>/weights/<id>, "
            "tinker://<run>/sampler_weights/<id>, or the bare id)"
        ) from None
    return parsed.checkpoint_id.split("/", 1)[1]


def with_path(session_id: str, kind: str, response: Any) -> Any:
    """A save's `response` with its ``path`` (the SDK's bare id) as a ``tinker://`` path whose
    middle part is `kind` (``weights``, ``sampler_weights``, ``external_weights``)."""
    return response.model_copy(update={"path": path_of(session_id, kind, response.path)})
