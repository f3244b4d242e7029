"""What one node of a local run executes: the training runtime's command (`tgnb.runs.node.command`,
as the process model `tgnb.runs.node.processes` says), or a stand-in named by `TRAIN_MODULE_ENV`
(tests of the supervisor alone), and a free loopback port for the rendezvous."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from tgnb.backends.local import proctree
from tgnb.config import MASK_VARS_ENV, SECRET_ENV, looks_secret
from tgnb.runs import node
from tgnb.runs.store import RunRecord

TRAIN_MODULE = "tgnb.train"
#: The module a node runs (default ``tgnb.train``); tests of the supervisor alone set a stand-in.
TRAIN_MODULE_ENV = "TGNB_TRAIN_MODULE"


def host_gpus(env: Mapping[str, str] | None = None, dev: Path = Path("/dev")) -> int:
    """The GPUs a process started here can use: ``CUDA_VISIBLE_DEVICES`` when set, else the NVIDIA
    devices of this machine. The emulated nodes' GPUs are not devices: a local run's processes
    share this machine's (none on a CPU-only machine)."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return 0 if not ids or ids[0].startswith("-") else len(ids)
    try:
        return sum(1 for p in dev.iterdir() if re.fullmatch(r"nvidia[0-9]+", p.name))
    except OSError:
        return 0


def node_gpus(asked: int, nodes_gpus: list[int], env: Mapping[str, str] | None = None) -> int:
    """The GPUs a local run has on each node: what it asked for, within the emulator's node
    records (`NodeInfo.gpus`) and this machine's devices shared among its nodes."""
    per_node = host_gpus(env) // max(1, len(nodes_gpus))
    return min([asked, per_node, *nodes_gpus])


def train_command(
    config: Path, run_dir: Path, procs: node.Processes, nodes: int, rank: int, rdzv: str
) -> list[str]:
    """The command one node runs (`tgnb.runs.node.command`): the training runtime, under torchrun
    through tgnb's launcher when `procs` says so."""
    module = os.environ.get(TRAIN_MODULE_ENV)
    if module:  # a stand-in runtime (tests of the supervisor alone)
        return [sys.executable, "-m", module, str(config), "--run-dir", str(run_dir)]
    torchrun = None
    if procs.torchrun:
        torchrun = [
            f"--nnodes={nodes}",
            f"--nproc_per_node={procs.nproc}",
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


def node_env(
    record: RunRecord, node_name: str, restart: int, slurm: bool, notice: Path | None
) -> dict[str, str]:
    """A node's environment: this process's, less every secret the run did not declare
    (`tgnb.config.SECRET_ENV` and the names that look like one: the kernel's HF, W&B and AWS
    keys), as Slurm and Kubernetes pass only the declared ones; the run's ``env``; its
    ``secrets``, and their names for the node to mask (`tgnb.config.MASK_VARS_ENV`). On a
    Slurm-type cluster, the restart count as Slurm's and the notice file the runtime watches."""
    spec = record.spec
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV and not looks_secret(k)}
    env.update({k: str(v) for k, v in spec.env.items()})
    for var, ref in spec.secrets.items():
        value = os.environ.get(ref.env or var)
        if value is not None:
            env[var] = value
    env.pop(MASK_VARS_ENV, None)
    if spec.secrets:
        env[MASK_VARS_ENV] = ",".join(sorted(spec.secrets))
    env.update(
        {
            node.NODE_ENV: node_name,
            node.RUN_ENV: record.name,
            node.RESTART_ENV: str(restart),
            node.METERED_ENV: "engine",  # the supervisor meters the run (its `_held_gpus`)
            "PYTHONUNBUFFERED": "1",
        }
    )
    env[proctree.TAG_ENV] = proctree.tag(record.id, restart)  # its whole tree carries it
    if slurm:
        env["SLURM_RESTART_COUNT"] = str(restart)
        if notice is not None:
            env[node.NOTICE_ENV] = str(notice)
    return env
