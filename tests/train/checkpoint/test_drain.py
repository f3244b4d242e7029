"""A drain notice with no signal makes ``python -m tgnb.train`` checkpoint at the next step boundary
and exit with EXIT_PREEMPTED; under Slurm it then requeues its own job.

Slurm is faked by a stand-in ``scontrol`` script on PATH (``show node`` prints the state from a
file, ``requeue`` is logged); the real Slurm path is covered by the workload tests. The second half
uses the notice file (``TGNB_NOTICE_FILE``), the local emulator's real mechanism, and resumes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import EXIT_PREEMPTED
from tgnb.train import checkpoint as ck


def standin_scontrol(bin_dir: Path, state_file: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    calls = state_file.parent / "scontrol-calls.log"
    script = bin_dir / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = show ]; then echo "NodeName=$3 Arch=x86_64 CoresPerSocket=1"; '
        f'echo "   State=$(cat {state_file}) ThreadsPerCore=1"; exit 0; fi\n'
        f'echo "$@" >> {calls}\n'
    )
    script.chmod(0o755)
    return calls


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_drain_notice_checkpoints_requeues_and_resumes(launcher: Any, tmp_path: Path) -> None:
    run_dir = tmp_path / "drained"
    common = ("algorithm=dpo", "model=tiny", "max_steps=200", "checkpoint.drain_poll_seconds=0.2")

    # 1. Slurm: the node is drained (no signal); the run checkpoints, requeues its job, exits 75.
    state = tmp_path / "node-state"
    state.write_text("ALLOCATED")
    calls = standin_scontrol(tmp_path / "bin", state)
    slurm = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURMD_NODENAME": "gpu-node-7",
    }
    run = launcher.start(run_dir, *common, env=slurm)
    run.wait_step(3, timeout=600)
    state.write_text("MIXED+DRAIN")
    assert run.wait(300) == EXIT_PREEMPTED, run.tail()
    notice = run.events("DrainNoticeReceived")[-1]["data"]
    assert notice["via"] == "scontrol" and notice["node"] == "gpu-node-7"
    assert notice["state"] == "MIXED+DRAIN"
    saved = run.events("CheckpointSaved")[-1]["data"]
    assert saved["trigger"] == "drain" and saved["step"] == notice["step"] == max(run.steps())
    assert [e["data"]["job_id"] for e in run.events("RunRequeued")] == ["4242"]
    assert calls.read_text().split("\n")[0] == "requeue 4242"
    assert run.events("RunExited")[-1]["data"]["exit_code"] == EXIT_PREEMPTED
    assert not run.events("SignalReceived")
    first_stop = saved["step"]

    # 2. The local emulator's notice file: resumes from that checkpoint, then drains again.
    notice_file = tmp_path / "node-dir" / "preemption-notice.json"
    run = launcher.start(run_dir, *common, env={"TGNB_NOTICE_FILE": str(notice_file)})
    run.wait_step(first_stop + 3, timeout=600)
    assert [e["data"]["step"] for e in run.events("RunResumed")] == [first_stop]
    notice_file.parent.mkdir()
    notice_file.write_text(json.dumps({"node": "emu-node-2", "deadline_s": 300}))
    assert run.wait(300) == EXIT_PREEMPTED, run.tail()
    notice = run.events("DrainNoticeReceived")[-1]["data"]
    assert notice["via"] == "notice-file"
    assert notice["notice"] == {"node": "emu-node-2", "deadline_s": 300}
    saved = run.events("CheckpointSaved")[-1]["data"]
    assert saved["trigger"] == "drain" and saved["step"] == max(run.steps()) > first_stop
    assert len(run.events("RunRequeued")) == 1  # not under Slurm this time: no requeue
    latest = ck.latest_complete(run_dir / "checkpoints")
    assert latest is not None and latest.step == saved["step"]
