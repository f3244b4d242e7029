"""Model resources created at the same time, on a fresh emulator daemon over real HTTP: all come
up, each loads its own model and trains; one whose model cannot load goes to ERROR alone and the
emulator keeps serving (before, concurrent ``from_pretrained`` calls left parameters on the meta
device: 5 at once, none came up, and no model loaded again until a restart)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from together.post_training import ModelResourcesClient

from tgnb.emulator.testing import EmulatorHandle, unloadable_model

from .conftest import TINY, ce_sample


def _create(base_model: str) -> ModelResourcesClient | Exception:
    try:
        return ModelResourcesClient.create(base_model=base_model, interval=0.1)
    except Exception as exc:  # the SDK raises RuntimeError when a resource ends in ERROR
        return exc


def _trains(mr: ModelResourcesClient) -> bool:
    with mr.create_session(lora_config={"rank": 2}, interval=0.1) as sess:
        out = sess.trainer.forward_backward(
            samples=[ce_sample([1, 5, 6, 7, 8])], loss={"type": "cross_entropy"}
        )
    return math.isfinite(out.loss)


@pytest.mark.slow
def test_five_resources_created_at_once_all_come_up_and_a_broken_one_fails_alone(
    rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    names = [TINY] * 5 + [unloadable_model(tmp_path)]
    with ThreadPoolExecutor(len(names)) as pool:
        made = list(pool.map(_create, names))
    *good, bad = made
    try:
        assert all(isinstance(mr, ModelResourcesClient) for mr in good), good
        assert isinstance(bad, RuntimeError), bad
        assert all(_trains(mr) for mr in good)  # type: ignore[arg-type]
        with ModelResourcesClient.create(base_model=TINY, interval=0.1) as after:
            assert _trains(after)  # the failure did not break loading for later resources
    finally:
        for mr in good:
            if isinstance(mr, ModelResourcesClient):
                mr.stop(force=True)
