"""Fixtures of the emulator's Post-Training API, shared by its tests (here), the client's
(tests/posttraining) and the Tinker layer's (tests/tinker), whose conftests re-export them.

- ``rl_daemon`` (module scope): one real emulator daemon for the test module (time scale 0.01:
  provisioning 0.6 s; inactivity timeouts stay real seconds, ``rl_expire`` ends one now). Loading
  torch and the model is paid once per module, not per test.
- ``rl_emulator`` (function scope): that daemon, with ``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY``
  set through monkeypatch (so the unmodified SDK's ``Together()``, ``ModelResourcesClient``,
  ``download_checkpoint`` and the Tinker layer find it), ``HF_HUB_OFFLINE=1``, and chaos reset
  before and after the test. ``rl_emulator.base_url`` / ``.api_key`` / ``.set_chaos(...)`` /
  ``.requests()`` / ``.rl_usage(id)`` / ``.rl_memory(id)`` / ``.rl_expire(id)`` drive it.
- ``tiny_model``: the built-in model's API name (``tgnb/tiny-llama``).
- helpers: `seq(tokens)` (a ModelInput dict), `ce_sample(tokens)` (a cross-entropy Sample).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle, running_emulator

TINY = "tgnb/tiny-llama"


@pytest.fixture(scope="module")
def rl_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    home: Path = tmp_path_factory.mktemp("rl-emulator")
    with running_emulator(home, time_scale=0.01) as emu:
        yield emu


@pytest.fixture
def rl_emulator(
    rl_daemon: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> Iterator[EmulatorHandle]:
    monkeypatch.setenv("TOGETHER_BASE_URL", rl_daemon.base_url)
    monkeypatch.setenv("TOGETHER_API_KEY", rl_daemon.api_key)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOGETHER_DISABLE_VERSION_CHECK", "1")
    rl_daemon.set_chaos(0.0)
    yield rl_daemon
    rl_daemon.set_chaos(0.0)


@pytest.fixture
def tiny_model() -> str:
    return TINY


def seq(tokens: list[int]) -> dict[str, Any]:
    return {"chunks": [{"encoded_text": {"tokens": list(tokens)}}]}


def ce_sample(tokens: list[int]) -> dict[str, Any]:
    """A cross-entropy sample over `tokens`: predict tokens[1:] from tokens[:-1]."""
    return {
        "model_input": seq(tokens[:-1]),
        "loss_fn_inputs": {
            "target_tokens": {"data": tokens[1:], "dtype": "int64"},
            "weights": {"data": [1.0] * (len(tokens) - 1), "dtype": "float32"},
        },
    }
