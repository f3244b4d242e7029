"""What one node of a local run executes: the training runtime's command (`tgnb.runs.node.command`),
or a stand-in named by `TRAIN_MODULE_ENV` (tests of the supervisor alone), and a free loopback port
for a multi-node run's rendezvous."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from tgnb.runs import node

TRAIN_MODULE = "tgnb.train"
#: The module a node runs (default ``tgnb.train``); tests of the supervisor alone set a stand-in.
TRAIN_MODULE_ENV = "TGNB_TRAIN_MODULE"


def train_command(config: Path, run_dir: Path, nodes: int, rank: int, rdzv: str) -> list[str]:
    """The command one node runs (`tgnb.runs.node.command`): the training runtime, under torchrun
    through tgnb's launcher when nodes > 1."""
    module = os.environ.get(TRAIN_MODULE_ENV)
    if module:  # a stand-in runtime (tests of the supervisor alone)
        return [sys.executable, "-m", module, str(config), "--run-dir", str(run_dir)]
    torchrun = None
    if nodes > 1:
        torchrun = [
            f"--nnodes={nodes}",
            "--nproc_per_node=1",
            f"--node_rank={rank}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={rdzv}",
        ]
    return node.command(sys.executable, str(config), str(run_dir), torchrun)


def free_port() -> int:
    """A loopback TCP port free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
