"""The drain watcher, polled directly.

Slurm is faked here by a stand-in ``scontrol`` script on PATH that prints what
``scontrol show node`` prints (real Slurm comes with the workload tests); the notice file is the real
mechanism the local emulator uses.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from tgnb.train.watcher import DrainWatcher, is_draining, node_state, notice_path


def standin_scontrol(bin_dir: Path, state_file: Path) -> None:
    """A stand-in ``scontrol``: ``show node N`` reports the state in `state_file`; other
    sub-commands are appended to ``calls.log`` beside it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = show ]; then echo "NodeName=$3 Arch=x86_64"; '
        f'echo "   State=$(cat {state_file}) ThreadsPerCore=1"; exit 0; fi\n'
        f'echo "$@" >> {state_file.parent / "calls.log"}\n'
    )
    script.chmod(0o755)


def test_is_draining() -> None:
    assert is_draining("IDLE+DRAIN") and is_draining("MIXED+DRAIN") and is_draining("DRAINING")
    assert not is_draining("ALLOCATED") and not is_draining(None) and not is_draining("")


def test_scontrol_drain_is_noticed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("ALLOCATED")
    standin_scontrol(tmp_path / "bin", state)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    env["SLURMD_NODENAME"] = "node7"
    env.pop("TGNB_NOTICE_FILE", None)
    old = os.environ["PATH"]
    os.environ["PATH"] = env["PATH"]
    try:
        assert node_state("node7") == "ALLOCATED"
        got: list[tuple[str, dict[str, object]]] = []
        fired = threading.Event()

        def on_notice(source: str, details: dict[str, object]) -> None:
            got.append((source, details))
            fired.set()

        watcher = DrainWatcher(on_notice, poll_seconds=0.05, env=env)
        assert watcher.active and watcher.check() is None
        watcher.start()
        state.write_text("MIXED+DRAIN")
        assert fired.wait(10)
        watcher.stop()
    finally:
        os.environ["PATH"] = old
    assert got == [("scontrol", {"node": "node7", "state": "MIXED+DRAIN"})]


def test_notice_file_is_noticed(tmp_path: Path) -> None:
    notice = tmp_path / "preemption-notice.json"
    env = {"TGNB_NOTICE_FILE": str(notice), "PATH": os.environ["PATH"]}
    assert notice_path(env) == notice
    assert notice_path({"TGNB_NOTICE_FILE": str(tmp_path)}) == notice  # a directory: the file in it
    assert notice_path({}) is None
    watcher = DrainWatcher(lambda s, d: None, poll_seconds=0.05, env=env)
    assert watcher.node is None and watcher.check() is None
    notice.write_text(json.dumps({"node": "n1", "deadline": "2026-01-01T00:05:00Z"}))
    assert watcher.check() == (
        "notice-file",
        {"path": str(notice), "notice": {"node": "n1", "deadline": "2026-01-01T00:05:00Z"}},
    )


def test_nothing_to_watch_starts_no_thread() -> None:
    watcher = DrainWatcher(lambda s, d: None, env={"PATH": "/nonexistent"}).start()
    assert not watcher.active and watcher._thread is None
    watcher.stop()
