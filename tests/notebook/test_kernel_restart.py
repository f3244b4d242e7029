"""Nothing lost when the kernel goes (issue 47 §4): a real Jupyter kernel (jupyter_client) for a
notebook the Jupyter server names (``JPY_SESSION_NAME``, as it does for every notebook's kernel)
opens a run; after a restart of that kernel, ``%tg runs`` lists the run again and ``%tg watch``
shows its whole history from the store (every step, the preemption's checkpoint and resume);
another notebook's kernel does not list it.

Real parts: the emulator daemon, the local engine's supervisor running the stand-in trainer
(a step counter that checkpoints on a drain notice), IPython kernels started by jupyter_client.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle

STANDIN_DIR = Path(__file__).resolve().parents[1] / "backends" / "local"
STEPS = 12


def _env(emulator: EmulatorHandle, notebook: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOGETHER_")}
    env.update(TGNB_HOME=str(emulator.home), JPY_SESSION_NAME=notebook)
    return env


class Kernel:
    """A real IPython kernel; `run` executes a cell and returns its outputs' text."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str) -> str:
        texts: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                texts.append(content["text"])
            elif kind in ("display_data", "execute_result", "update_display_data"):
                texts.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                texts.append("ERROR " + content["ename"] + ": " + content["evalue"])

        reply = self.kc.execute_interactive(code, output_hook=hook, timeout=180)
        out = "\n".join(texts)
        assert reply["content"]["status"] == "ok", out
        return out

    def restart(self) -> None:
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=120)

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture
def finished_run(emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A run of the stand-in trainer, preempted once, finished: its name."""
    from tgnb.session import attach, shutdown_local

    monkeypatch.setenv("TGNB_TRAIN_MODULE", "standin_train")
    monkeypatch.setenv("STANDIN_STEP_SECONDS", "0.3")
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(STANDIN_DIR) + (os.pathsep + path if path else ""))
    session = attach(local=True, home=emulator.home)
    try:
        assert session.scale(preemptible=8, wait=True, timeout=60, poll=0.2)
        run = session.launch("grpo", name="kept", max_steps=STEPS)
        wait_until(lambda: len(run.records("metrics")) >= 3 and run.status.nodes, timeout=120)
        session.preempt(run.status.nodes[0])
        assert run.wait(timeout=300, progress=False).state.value == "succeeded"
        yield run.name
    finally:
        shutdown_local(emulator.home)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_restarted_kernel_lists_the_notebooks_runs_with_their_history(
    emulator: EmulatorHandle, finished_run: str, tmp_path: Path
) -> None:
    setup = "%load_ext tgnb\n%tg attach --local"
    kernel = Kernel(_env(emulator, str(tmp_path / "train.ipynb")), tmp_path)
    try:
        kernel.run(setup)
        assert "no runs launched or opened in this notebook yet" in kernel.run("%tg runs")
        kernel.run(f"%tg watch {finished_run}")  # opened here: one of this notebook's runs
        assert finished_run in kernel.run("%tg runs")

        kernel.restart()
        kernel.run(setup)
        listed = kernel.run("%tg runs")
        assert finished_run in listed and "succeeded" in listed, listed
        panel = kernel.run(f"%tg watch {finished_run}")
        assert f"step {STEPS} / {STEPS}" in panel and "succeeded" in panel, panel
        assert "1 checkpoint" in panel and "1 resume" in panel, panel
        rows = kernel.run(
            "import tgnb\n"
            "from tgnb.notebook.widgets import RunPanel\n"
            f"run = tgnb.attach(local=True).run({finished_run!r})\n"
            "p = RunPanel(run)\n"
            "print(sorted({r['step'] for r in p.rows}), [m[1] for m in p.markers()])\n"
            "p.close()"
        )
        assert str(list(range(1, STEPS + 1))) in rows, rows  # every step, from the store
        assert "'checkpoint'" in rows and "'resume'" in rows, rows
    finally:
        kernel.stop()

    other = Kernel(_env(emulator, str(tmp_path / "other.ipynb")), tmp_path)
    try:
        other.run(setup)
        listed = other.run("%tg runs")
        assert "no runs launched or opened in this notebook yet" in listed, listed
        assert finished_run in other.run("%tg runs --all")
    finally:
        other.stop()
