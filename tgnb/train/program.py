"""Run the user's own program on the node: a script (``algorithm: script``, ``script: train.py``) or a
command (``command: [accelerate, launch, train.py]``), in the run's workdir snapshot.

The snapshot (`tgnb.runs.node.WORKDIR` in the run directory; the working directory when there is
none) is the working directory and the first entry of ``sys.path``, and of ``PYTHONPATH`` for a
command. The node contract's environment (`tgnb.runs.node.RUN_DIR_ENV`, `RUN_ENV`,
`RUN_FILE_ENV`, and `CHECKPOINT_ENV`, its view) tells `tgnb.train.protect` and
`tgnb.train.Checkpointer` where the run lives and its checkpoint policy.

A script runs in this process as ``__main__`` with ``sys.argv = [script, *args]`` (under torchrun,
once per rank: the engines start it as they start the built-in runtime); its exit code is the
process's, so a protected Trainer's 75 reaches the engine. A command runs as a child process, once
per node (it is its own launcher), with SIGTERM and SIGUSR1 passed on; its exit code is returned,
except after tgnb's SIGTERM when the command sealed no checkpoint (it exited 0 on the signal, or
died of it having trained steps not saved): the attempt is recorded as unsaved and the exit is 75,
so Slurm and Kubernetes, which read exit codes only, restart the run uncounted and the cockpit
says "stopped without a checkpoint at step N: K steps lost" (`tgnb.runs.outcome`). The command's
stderr passes through this process; an exit 1 whose last traceback is a failure every start would
repeat (`tgnb.runs.outcome.repeats`) is `node.Exit.REPEATS` (78), recorded with its line, final.
"""

from __future__ import annotations

import dataclasses
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from tgnb.errors import TrainConfigError
from tgnb.runs import node
from tgnb.tasks.config import TrainConfig


def workdir_of(run_dir: Path) -> Path:
    """The run's workdir snapshot, or the working directory when the run has none."""
    snap = run_dir / node.WORKDIR
    return snap if snap.is_dir() else Path.cwd()


def environment(cfg: TrainConfig, run_file: str | None = None) -> dict[str, str]:
    """The node contract's variables for the user's code: with `run_file` (the run file `cfg`
    was read from, unchanged), `node.RUN_FILE_ENV` names it; `node.CHECKPOINT_ENV` is the view
    of `cfg`'s checkpoint policy."""
    assert cfg.run_dir is not None
    env = {
        node.RUN_DIR_ENV: str(Path(cfg.run_dir).resolve()),
        node.RUN_ENV: str(cfg.name),
        node.CHECKPOINT_ENV: json.dumps(dataclasses.asdict(cfg.checkpoint), sort_keys=True),
    }
    if run_file is not None:
        env[node.RUN_FILE_ENV] = str(Path(run_file).resolve())
    return env


def run_program(cfg: TrainConfig, run_file: str | None = None) -> int:
    """Run `cfg`'s script or command (`run_file`: the run file it was read from, unchanged);
    its exit code."""
    assert cfg.run_dir is not None
    run_dir = Path(cfg.run_dir)
    workdir = workdir_of(run_dir)
    os.environ.update(environment(cfg, run_file))
    if run_file is None:  # a person's config, or a --set: no run file holds this one's policy
        os.environ.pop(node.RUN_FILE_ENV, None)
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
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stderr=subprocess.PIPE)
    except OSError as exc:
        raise TrainConfigError(f"command {argv[0]!r} could not start ({exc.strerror})") from None
    assert proc.stderr is not None
    tail = _Tail(proc.stderr)

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
    tail.join(timeout=5)  # a child of the command may still hold its stderr open
    if not signalled:
        return _repeating(code, tail.text(), run_dir, since) if code == 1 else code  # a traceback's
    from tgnb.train.launch import after_signal

    return after_signal(run_dir, code, since)


class _Tail(threading.Thread):
    """Copies a command's stderr to this process's as it comes (chunks, so a progress bar's
    ``\\r`` is not held back) and keeps its last `keep` bytes, where a Python traceback ends."""

    def __init__(self, pipe: IO[bytes], keep: int = 64 * 1024) -> None:
        super().__init__(name="tgnb-command-stderr", daemon=True)
        self.pipe, self.keep, self.data = pipe, keep, b""
        self.start()

    def run(self) -> None:
        out = getattr(sys.stderr, "buffer", None)
        while chunk := self.pipe.read1(65536):  # type: ignore[attr-defined]
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(chunk.decode("utf-8", "replace"))
                sys.stderr.flush()
            self.data = (self.data + chunk)[-self.keep :]
        self.pipe.close()

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")


def _repeating(code: int, stderr: str, run_dir: str, since: int) -> int:
    """A command's exit `code`, or `node.Exit.REPEATS` (final on every engine) when the last
    traceback it printed is a failure every start would repeat (`tgnb.runs.outcome.repeats`: a
    module not installed, CUDA absent), with its line recorded and printed as a script's is."""
    from tgnb.events import RUN_EXITED
    from tgnb.runs.outcome import Attempt, failure_line, repeat_fix, repeats
    from tgnb.train.record import Recorder

    line = failure_line(stderr)
    if line is None or not repeats(line):
        return code
    if Attempt.read(run_dir, since).exit_reason is None:  # its own Checkpointer recorded none
        recorder = Recorder(run_dir, os.environ.get(node.RUN_ENV) or Path(run_dir).name)
        recorder.event(RUN_EXITED, f"failed: {line}"[:500], exit_reason="failed",
                       exit_code=int(node.Exit.REPEATS), step=None)  # fmt: skip
        recorder.close()
    from tgnb.config import register_node_secrets, scrub

    register_node_secrets()
    why = f"tgnb train: {line[:400]}: it fails the same way at every start: {repeat_fix(line)}"
    print(scrub(why), file=sys.stderr, flush=True)
    return int(node.Exit.REPEATS)
