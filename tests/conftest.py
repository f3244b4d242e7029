"""Shared fixtures and helpers for the whole suite.

Test modules import the helpers by their absolute name (``from tests.conftest import wait_until``),
which stays right when a test file moves to another folder.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tgnb.emulator.testing import EmulatorHandle, running_emulator

T = TypeVar("T")

#: The libraries the notebook side must never import (``%load_ext tgnb``, ``import tgnb``, the
#: magics' parsing): the training stack, the Kubernetes client, pandas. Tests add ``"together"``
#: (the SDK, imported on first use) where the code under test must not reach it either.
HEAVY = (
    "torch",
    "trl",
    "transformers",
    "kubernetes",
    "datasets",
    "accelerate",
    "peft",
    "pandas",
    "wandb",
    "mlflow",
)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that start a training process are marked ``training`` (`starts_training`): the
    fast tier, ``-m "not training"``, leaves them out.

    Under pytest-xdist (``-n 3 --dist loadgroup``, the README's command), the tests of the one
    real Slurm node run on one worker, one after another: they drain, requeue and re-feature that
    node, which a second worker's job would see. The tests of a module that share a module-scoped
    fixture (executed notebooks, a JupyterLab, an emulator with its runs) run on one worker too:
    split between two, each worker made the fixture again (the notebooks' 100 s and the recipes'
    118 s ran twice). Every other test owns what it starts.

    The order is the collection's: handing the slow tests out first made the run longer (49:41
    against 46:14), two training runs then always contending for the two cores where a slow test
    beside quick ones, which mostly wait, has about a core of its own."""
    for item in items:
        if starts_training(item):
            item.add_marker(pytest.mark.training)
        if item.get_closest_marker("slurm") or "slurm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


#: The fixtures that launch runs or training programs, so the tests that use them start one: a
#: demo cluster on the emulator (``session``), the stand-in trainer (``standin``), torchrun and
#: Checkpointer launches (``launcher``), ``python -m tgnb.train`` (``train``), executed notebooks
#: (``executed``), the real Slurm node (``slurm``), a JupyterLab whose kernels launch (``lab``).
TRAINING_FIXTURES = frozenset(
    {"session", "standin", "launcher", "train", "executed", "slurm", "lab", "login_node"}
)

#: The modules whose tests run training loops on the emulator's Post-Training engine (Tinker
#: scripts and clients, the SDK's own loop: forward_backward, optim_step, sampling), every test.
TRAINING_MODULES = frozenset(
    f"tests/{name}.py"
    for name in (
        "tinker/test_async_rl",
        "tinker/test_tinker_038",
        "tinker/test_tinker_as_written",
        "tinker/test_tinker_fidelity",
        "tinker/test_tinker_layer",
        "tinker/test_tinker_leftovers",
        "emulator/rl/test_sdk_chaos",
        "emulator/rl/test_sdk_e2e",
    )
)


def starts_training(item: pytest.Item) -> bool:
    """Whether `item` starts a training process (the marker ``training``; the fast tier is
    ``-m "not training"``): marked so itself, or ``slow`` (the long tests are the ones that
    train, end to end), or using one of `TRAINING_FIXTURES`, or in one of `TRAINING_MODULES`. A
    test that launches a run some other way carries ``@pytest.mark.training`` itself."""
    if item.get_closest_marker("training") or item.get_closest_marker("slow"):
        return True
    if item.nodeid.split("::")[0] in TRAINING_MODULES:
        return True
    return bool(TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())))


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether `item` uses a fixture made once per module (or class, or package). pytest names a
    test's fixture definitions only on a private attribute (``_fixtureinfo``); without it (another
    pytest), nothing is grouped and the suite still runs, each worker making its own."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {})
    return any(d.scope in ("module", "class", "package") for ds in defs.values() for d in ds)


def wait_until(
    pred: Callable[[], T],
    timeout: float = 120.0,
    *,
    what: str = "the condition",
    every: float = 0.1,
) -> T:
    """Call `pred` every `every` s until it returns something truthy, and return that; an
    AssertionError naming `what` once `timeout` s have passed without."""
    deadline = time.monotonic() + timeout
    while not (value := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return value


async def async_wait_until(
    pred: Callable[[], Awaitable[T]],
    timeout: float = 60.0,
    *,
    what: str = "the condition",
    every: float = 0.2,
) -> T:
    """`wait_until` for a coroutine predicate, sleeping on the event loop between calls."""
    deadline = time.monotonic() + timeout
    while not (value := await pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)
    return value


def modules_after(code: str) -> set[str]:
    """The names in ``sys.modules`` after `code` ran in a fresh interpreter."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def heavy_in(modules: Iterable[str], also: Iterable[str] = ()) -> list[str]:
    """The modules among `modules` that belong to a `HEAVY` library (or one in `also`), sorted."""
    heavy = set(HEAVY) | set(also)
    return sorted(m for m in modules if m.split(".")[0] in heavy)


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[EmulatorHandle]:
    """A real emulator daemon on a free loopback port, time compressed 100x, stopped afterwards.

    ``emulator.base_url`` / ``emulator.api_key`` / ``emulator.env`` point the SDK or ``tg`` at it;
    ``emulator.preempt(...)``, ``.nodes(...)``, ``.requests()``, ``.set_chaos(...)``,
    ``.set_capacity(...)`` drive it. Its files live under ``tmp_path / "emulator"``.
    """
    with running_emulator(tmp_path, time_scale=0.01) as emu:
        yield emu


@pytest.fixture(scope="session")
def ip() -> Any:
    """The test IPython shell (a real `InteractiveShell`) with the tgnb extension loaded."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()  # once per process: another test module may have started it
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "tgnb")
    return shell
