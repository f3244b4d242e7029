"""Warm starts for the local backend: fork the training process from a supervisor that has already
imported the training stack, as a node with the container image cached starts a pod quickly.

On a 2-core machine importing torch, transformers and TRL takes 10 s or more, far longer than
saving or loading the tiny model's checkpoint; paid again at every restart it would dominate the
cost of a preemption. The supervisor of a single-node run imports them once (with the run's
environment already applied), then each start forks: the child makes itself a new session and
process group, takes the run's environment, sends its output to the run's log and runs
``python -m tgnb.train`` through `runpy` exactly as the interpreter would. Nothing is shared at run
time: the child is a fresh process that received the parent's imported modules, nothing more.

``TGNB_LOCAL_WARM_START=0`` turns it off (every start then execs a new interpreter).
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping, Sequence

WARM_ENV = "TGNB_LOCAL_WARM_START"
_PRELOAD = (
    "torch",
    "transformers",
    "datasets",
    "trl",
    "tgnb.train.cli",
    "tgnb.train.runner",
    "tgnb.train.preemption",
)


def preload(module: str) -> bool:
    """Import what `module` (``tgnb.train``) will need; False when warm starts are off or fail."""
    if module != "tgnb.train" or os.environ.get(WARM_ENV, "1") == "0":
        return False
    try:
        for name in _PRELOAD:
            importlib.import_module(name)
        import trl

        # TRL exports lazily: touch the trainers so their modules are really imported.
        for name in ("GRPOTrainer", "GRPOConfig", "DPOTrainer", "DPOConfig"):
            getattr(trl, name)
    except Exception as exc:  # fall back to cold starts rather than fail the run
        print(f"warm start disabled: {type(exc).__name__}: {exc}", flush=True)
        return False
    return True


class ForkedProcess:
    """A forked training process, with the part of `subprocess.Popen`'s interface we use."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"process {self.pid} still running")
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode


def fork_module(
    module: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, log_fd: int
) -> ForkedProcess:
    """Fork and run ``python -m module argv...`` in the child (new session, `env`, output to
    `log_fd`). The child never returns into the caller's code."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = 1
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *argv]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
