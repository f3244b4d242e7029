"""Run the user's own program on the node: a script (``algorithm: script``, ``script: train.py``) or a
command (``command: [accelerate, launch, train.py]``), in the run's workdir snapshot.

The snapshot (`tgnb.runs.node.WORKDIR` in the run directory; the working directory when there is
none) is the working directory and the first entry of ``sys.path``, and of ``PYTHONPATH`` for a
command. The node contract's environment (`tgnb.runs.node.RUN_DIR_ENV`, `RUN_ENV`,
`CHECKPOINT_ENV`) tells `tgnb.train.protect` and `tgnb.train.Checkpointer` where the run lives.

A script runs in this process as ``__main__`` with ``sys.argv = [script, *args]`` (under torchrun,
once per rank: the engines start it as they start the built-in runtime); its exit code is the
process's, so a protected Trainer's 75 reaches the engine. A command runs as a child process, once
per node (it is its own launcher), with SIGTERM and SIGUSR1 passed on; its exit code is returned,
except after tgnb's SIGTERM when the command sealed no checkpoint (it exited 0 on the signal, or
died of it having trained steps not saved): the attempt is recorded as unsaved and the exit is 75,
so Slurm and Kubernetes, which read exit codes only, restart the run uncounted and the cockpit
says "stopped without a checkpoint at step N: K steps lost" (`tgnb.runs.outcome`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tgnb.errors import TrainConfigError
from tgnb.runs import node
from tgnb.tasks.config import TrainConfig


def workdir_of(run_dir: Path) -> Path:
    """The run's workdir snapshot, or the working directory when the run has none."""
    snap = run_dir / node.WORKDIR
    return snap if snap.is_dir() else Path.cwd()


def environment(cfg: TrainConfig) -> dict[str, str]:
    """The node contract's variables for the user's code."""
    assert cfg.run_dir is not None
    return {
        node.RUN_DIR_ENV: str(Path(cfg.run_dir).resolve()),
        node.RUN_ENV: str(cfg.name),
        node.CHECKPOINT_ENV: json.dumps(dataclasses.asdict(cfg.checkpoint), sort_keys=True),
    }


def run_program(cfg: TrainConfig) -> int:
    """Run `cfg`'s script or command; its exit code."""
    assert cfg.run_dir is not None
    run_dir = Path(cfg.run_dir)
    workdir = workdir_of(run_dir)
    os.environ.update(environment(cfg))
    if cfg.command is not None:
        return _command(cfg.command, workdir, str(run_dir))
    assert cfg.script is not None
    script = workdir / cfg.script
    if not script.is_file():
        raise TrainConfigError(f"script {cfg.script!r} is not in the workdir {workdir}")
    os.chdir(workdir)
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    sys.argv = [str(script), *cfg.args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException as exc:
        _record_failure(cfg, exc)
        raise
    return 0


def _record_failure(cfg: TrainConfig, exc: BaseException) -> None:
    """``RunExited`` for an exception that no protected trainer recorded (an import error, a bug
    before or after ``trainer.train()``), so the cockpit shows its line."""
    if getattr(exc, "_tgnb_recorded", False) or isinstance(exc, KeyboardInterrupt):
        return
    from tgnb.train.record import Recorder

    assert cfg.run_dir is not None
    recorder = Recorder(cfg.run_dir, cfg.name)
    first = str(exc).splitlines()[0] if str(exc) else ""
    from tgnb.events import RUN_EXITED
    from tgnb.runs.outcome import repeats

    code = node.Exit.REPEATS if repeats(exc) else node.Exit.FAILED  # as `tgnb.train.cli` exits
    recorder.event(
        RUN_EXITED,
        f"failed: {type(exc).__name__}: {first}"[:500],
        exit_reason="failed",
        exit_code=int(code),
        step=None,
    )
    recorder.close()


def _command(argv: list[str], workdir: Path, run_dir: str) -> int:
    """Run the command; its exit code, or 75 when tgnb's SIGTERM stopped it and it sealed nothing
    (`tgnb.train.launch.after_signal`: exit 0 after the signal is not a success)."""
    from tgnb.runs.outcome import events_size

    since = events_size(run_dir)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(workdir), env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(argv, cwd=workdir, env=env)
    except OSError as exc:
        raise TrainConfigError(f"command {argv[0]!r} could not start ({exc.strerror})") from None

    signalled: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        if signum == signal.SIGTERM:
            signalled.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, forward)
    code = proc.wait()
    code = code if code >= 0 else 128 - code
    if not signalled:
        return code
    from tgnb.train.launch import after_signal

    return after_signal(run_dir, code, since)
