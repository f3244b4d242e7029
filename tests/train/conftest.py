"""Fixtures for the training runtime's tests: offline Hugging Face, a private TGNB_HOME per session
(the tiny model is built once into it), and helpers to run ``python -m tgnb.train`` for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def tgnb_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("tgnb-home")
    old = os.environ.get("TGNB_HOME")
    os.environ["TGNB_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("TGNB_HOME", None)
    else:
        os.environ["TGNB_HOME"] = old


def run_train(
    args: list[str], timeout: float = 300, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tgnb.train ARGS`` in a fresh process (real TRL on the CPU)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RANK": "0"}
    return subprocess.run(
        [sys.executable, "-m", "tgnb.train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        **popen,
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def prefixed(stdout: str) -> list[dict[str, Any]]:
    """The ``@tgnb `` JSON records a backend would follow in the run's log."""
    from tgnb.events import STDOUT_PREFIX

    return [
        json.loads(line[len(STDOUT_PREFIX) :])
        for line in stdout.splitlines()
        if line.startswith(STDOUT_PREFIX)
    ]


@pytest.fixture
def train() -> Any:
    return run_train


@pytest.fixture
def rows() -> Any:
    return read_rows


@pytest.fixture
def stdout_records() -> Any:
    return prefixed
