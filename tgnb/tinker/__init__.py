"""A Tinker layer for Together Post-Training: ``import tgnb.tinker as tinker`` and a Tinker script
runs otherwise unchanged, on the service or on tgnb's local emulator alike.

It completes the SDK's own layer (``together.post_training.tinker``, whose public classes it
extends and whose types are the genuine ``tinker.types``) with the calls Tinker scripts make that
the SDK's layer lacks, each mapped onto Post-Training API routes only, so it behaves the same
against ``api.together.ai`` as against the emulator (``TOGETHER_BASE_URL``, no ``/v1``):

=============================================  ============================================
Tinker call                                    Post-Training routes
=============================================  ============================================
``ServiceClient.create_lora_training_client``  ``POST model-resources`` + ``training-sessions``
``...create_training_client_from_state``       ``GET checkpoints/{id}``, ``GET training-
  (``_with_optimizer``, ``_async``)              sessions/{id}`` (its LoRA config), new session
                                               with ``resume_from_checkpoint_id``
``ServiceClient.create_sampling_client``       as above, then ``weights-sync``: a sampler on a
  (``model_path=`` / ``base_model=``)            session of its own (it owns it: ``close()``)
``ServiceClient.get_server_capabilities``      ``GET supported-models``
``TrainingClient.forward[_backward]``          ``forward-backward`` with ``loss_fn_outputs``
                                               returned by default, Tinker's loss defaults
``TrainingClient.forward_backward_custom``     ``forward-backward`` then ``custom-forward-
                                               backward`` (the SDK's)
``TrainingClient.get_info`` / ``get_tokenizer``  ``GET training-sessions/{id}``; the tokenizer
                                               is loaded locally, no Hub retries when cached
``TrainingClient.load_state[_with_optimizer]``   a new session on the same resource resumed
                                               from the checkpoint; the old one is stopped
``TrainingClient.save_state``                  ``training-checkpoint``; path ``tinker://<session
                                               id>/weights/<checkpoint id>``
``TrainingClient.save_weights_for_sampler``    ``training-checkpoint`` + ``inference-
                                               checkpoint``; path ``tinker://<session id>/
                                               sampler_weights/<inference checkpoint id>``
``TrainingClient.save_weights_external``      as ``save_weights_for_sampler`` (Tinker 0.38),
                                               path ``tinker://<id>/external_weights/<id>``
``ServiceClient.create_rest_client``           `RestClient`: ``GET checkpoints`` (list),
                                               ``GET checkpoints/{id}/download`` (the files'
                                               URLs, ``get_external_weights_urls``: the
                                               adapter renamed into Tinker's layout)
``TrainingClient.create_sampling_client``      as ``ServiceClient.create_sampling_client``
``save_weights_and_get_sampling_client``       ``weights-sync`` (the SDK's)
``SamplingClient.sample`` / ``compute_logprobs``  ``sample`` (the SDK's submission, tinker's
                                               types; `_sample`: top-k sampled logprobs by a
                                               scoring pass, ``prompt_logprobs_last_n``)
``forward[_backward](..., "gspo")``            ``forward-backward`` (scoring) then ``custom-
                                               forward-backward``, the loss computed here
                                               (`_losses`)
``SamplingClient.get_base_model`` /            ``GET training-sessions/{id}``
  ``get_tokenizer``
=============================================  ============================================

Every call above answers what can be awaited and has its ``_async`` twin (deprecated, with the
installed tinker's own warning, where that tinker deprecates it: `_deprecated`), and the
synchronous ones work inside a running event loop as on Tinker, with its warning where it gives
one (`tgnb.tinker._offloop`). A program whose own modules ``import tinker`` runs with ``python -m tgnb.tinker script.py args...`` or
``tgnb.tinker.install()`` first in its entry script (`tgnb.tinker._install`). Loss defaults: Together documents none for PPO and
CISPO, so this layer sends Tinker's own explicitly (PPO clips to [0.8, 1.2], CISPO to [0.0, 4.0];
`TINKER_LOSS_DEFAULTS`); the emulator's defaults for raw API calls are written down in
`tgnb.emulator.rl.losses`. Losses are Tinker's: ``cross_entropy``, ``importance_sampling``,
``ppo``, ``cispo``, ``dro`` (the SDK's table).

What it still cannot serve, and why:

- On ``RestClient``: publishing, deleting, one archive per checkpoint, downloading a
  training (``weights/``) checkpoint, and Tinker's calls on runs, sessions and samplers: each is
  refused when called, with why (`tgnb.tinker._rest`).
- Checkpoint names, ``ttl_seconds``, ``overwrite``: checkpoints are server-assigned ids with no
  TTL, so a path's last part is that id, not the name given (`tgnb.tinker._paths`); every call
  that takes a path also takes the bare id this layer answered before. A TTL, given at a save or
  by ``RestClient.set_checkpoint_ttl_from_tinker_path``, is ignored with a warning.
- ``weights_access_token`` (another account's checkpoints): no such grant on the API; refused.
- ``train_mlp=False`` / ``train_attn=False``: Post-Training adapts every linear layer; refused
  rather than trained differently.
- A sampling client pinned to an older policy version: a session samples the weights it last
  published (``save_weights_and_get_sampling_client`` answers a client of the newest ones);
  sampling saved weights opens a session (on the service client's shared resources).
- ``get_telemetry`` answers ``None``; ``SamplingClient.create`` (an internal holder-based
  constructor) and ``on_queue_state_change`` (Tinker's queue notices) have no counterpart.
- Tinker 0.38's provenance (``Datum.with_provenance``, the ``stable_reinforce`` loss): the API
  takes none; ``stable_reinforce`` is refused (it reads what Tinker's sampler records).
  ``project_id``, ``copy_weights``, ``create_custom_loss``, sampler handles, non-AdamW
  optimizers, ``target_prompt_logprobs`` and ``prompt_alt_tokens_k`` are refused when given.
- tinker versions: 0.23.1 (``together[tinker]``'s pin) to 0.38 (`_compat`). Sampled sequences answer ``sequence_id = None`` and the span classes exist
  (`tgnb.tinker._newer`), so code written for 0.38 that attaches provenance only to sequences
  with an id (the cookbook 0.6) runs without it.
- ``load_state`` runs when called (its future is already resolved): collect what was submitted
  before it first, as a Tinker script does.
"""

from __future__ import annotations

from typing import Any

from tgnb.tinker import _compat  # noqa: F401  # isort: skip  # first: the SDK layer imports on newer tinker
import tinker as _genuine
from together.post_training.tinker import APIFuture, types

from tgnb.tinker._deprecated import warn_as_tinker_does
from tgnb.tinker._install import install, installed, uninstall
from tgnb.tinker._newer import NEWER
from tgnb.tinker._paths import ParsedCheckpointTinkerPath
from tgnb.tinker._rest import RestClient, genuine_rest_client
from tgnb.tinker._sampling import SamplingClient
from tgnb.tinker._service import ServiceClient
from tgnb.tinker._support import TINKER_LOSS_DEFAULTS, load_tokenizer
from tgnb.tinker._training import TrainingClient

__all__ = [
    "TINKER_LOSS_DEFAULTS",
    "APIFuture",
    "ParsedCheckpointTinkerPath",
    "RestClient",
    "SamplingClient",
    "ServiceClient",
    "TrainingClient",
    "install",
    "installed",
    "load_tokenizer",
    "types",
    "uninstall",
]

#: What the installed tinker marks deprecated on each client, warned here as tinker warns it
#: (`tgnb.tinker._deprecated`): the ``_async`` twins with tinker 0.38, nothing with 0.23.1.
DEPRECATED: dict[str, list[str]] = {
    ours.__name__: warn_as_tinker_does(ours, theirs)
    for ours, theirs in (
        (ServiceClient, _genuine.ServiceClient),
        (TrainingClient, _genuine.TrainingClient),
        (SamplingClient, _genuine.SamplingClient),
        (RestClient, genuine_rest_client()),
    )
}

#: Names of the genuine package that talk to Tinker's own service: not answered here.
_TINKERS_OWN = frozenset({"AdminClient"})


def __getattr__(name: str) -> Any:
    """Tinker's types (``tinker.Datum``, ``tinker.AdamParams``, ...) and its error classes."""
    if hasattr(types, name):
        return getattr(types, name)
    if name in NEWER:
        return NEWER[name]
    if name not in _TINKERS_OWN and hasattr(_genuine, name):
        return getattr(_genuine, name)  # its errors, warnings, request options, ...
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*__all__, *dir(types), *NEWER})
