"""The one process model (`tgnb.runs.node.processes`), the table of docs/process-model.md: what
each node of a run starts, by the run's shape, node count and GPUs per node."""

from __future__ import annotations

from typing import Any

import pytest

from tgnb.runs.node import Processes, processes
from tgnb.runs.trainconfig import from_dict

SCRIPT = {"algorithm": "script", "script": "train.py"}
COMMAND = {"algorithm": "script", "command": ["accelerate", "launch", "train.py"]}
TASK = {"algorithm": "grpo", "model": "tiny"}


@pytest.mark.parametrize(
    ("train", "nodes", "gpus", "expected"),
    [
        (SCRIPT, 1, 0, Processes(nproc=1, torchrun=True)),  # CPU node: one process, RANK set
        (SCRIPT, 1, 8, Processes(nproc=8, torchrun=True)),
        (SCRIPT, 2, 0, Processes(nproc=1, torchrun=True)),
        (SCRIPT, 2, 4, Processes(nproc=4, torchrun=True)),
        (COMMAND, 1, 8, Processes(nproc=1, torchrun=False)),  # its own launcher: once per node
        (COMMAND, 2, 0, Processes(nproc=1, torchrun=False)),
        (TASK, 1, 0, Processes(nproc=1, torchrun=False)),
        (TASK, 1, 8, Processes(nproc=8, torchrun=True)),
        (TASK, 2, 0, Processes(nproc=1, torchrun=True)),
    ],
)
def test_processes(train: dict[str, Any], nodes: int, gpus: int, expected: Processes) -> None:
    assert processes(from_dict(train), nodes, gpus) == expected
