"""Helpers for the checkpoint tests: start ``python -m tgnb.train`` on the built-in tiny assets, wait
for logged steps, signal it, and read what the run left (events, metrics, checkpoints)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The size of the `small_disk` tmpfs.
SMALL_DISK = "2m"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


class Run:
    """One training process of a run directory (a run may have several, one after another)."""

    def __init__(self, proc: subprocess.Popen[str], run_dir: Path, log: Path) -> None:
        self.proc = proc
        self.run_dir = run_dir
        self.log = log

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        evs = read_jsonl(self.run_dir / "events.jsonl")
        return [e for e in evs if reason is None or e["reason"] == reason]

    def steps(self) -> list[int]:
        return [int(m["step"]) for m in read_jsonl(self.run_dir / "metrics.jsonl")]

    def wait_step(self, step: int, timeout: float = 180) -> int:
        """Wait until a metrics row with at least `step` is logged; returns the newest step."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            steps = self.steps()
            if steps and max(steps) >= step:
                return max(steps)
            if self.proc.poll() is not None:
                raise AssertionError(f"run exited {self.proc.returncode} early:\n{self.tail()}")
            time.sleep(0.05)
        raise AssertionError(f"step {step} not reached in {timeout} s:\n{self.tail()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"run did not exit within {timeout} s:\n{self.tail()}") from None

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else ""


class Launcher:
    """Starts training processes with an environment that downloads nothing."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TGNB_HOME": str(tmp_path / "home"),
            "OMP_NUM_THREADS": "1",
        }
        for name in ("TGNB_NOTICE_FILE", "SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_RESTART_COUNT"):
            self.env.pop(name, None)
        self.procs: list[subprocess.Popen[str]] = []
        self.count = 0

    def start(
        self,
        run_dir: Path,
        *overrides: str,
        env: dict[str, str] | None = None,
        argv: list[str] | None = None,
    ) -> Run:
        self.count += 1
        log = self.tmp_path / f"proc-{self.count}.log"
        cmd = argv or [sys.executable, "-m", "tgnb.train"]
        cmd = [*cmd, "--run-dir", str(run_dir), *(x for o in overrides for x in ("--set", o))]
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                text=True,
                env={**self.env, **(env or {})},
                start_new_session=True,
            )
        self.procs.append(proc)
        return Run(proc, run_dir, log)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def torchrun(ranks: int) -> list[str]:
    """``python -m tgnb.train`` on `ranks` processes under tgnb's torchrun launcher (standalone)."""
    launch = [sys.executable, "-m", "tgnb.train.launch", "--standalone"]
    return [*launch, f"--nproc_per_node={ranks}", "-m", "tgnb.train"]


def worker_pids(parent: int) -> dict[int, int]:
    """``{rank: pid}`` of the launcher's worker processes (its children)."""
    out: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                out[int(item[5:])] = int(stat.parent.name)
    return out


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Launcher]:
    lau = Launcher(tmp_path)
    try:
        yield lau
    finally:
        lau.close()


def load_weights(checkpoint: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


Launcher.weights = staticmethod(load_weights)  # type: ignore[attr-defined]
Launcher.read_jsonl = staticmethod(read_jsonl)  # type: ignore[attr-defined]


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A small tmpfs (`SMALL_DISK`) (root may mount one here; otherwise the test is skipped, saying why)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    got = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK}", "tmpfs", str(mnt)], check=False
    )
    if got.returncode != 0:
        pytest.skip("this machine does not allow mounting a tmpfs")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)
