"""An emulator restart loses nothing and hides nothing (issue 23 §3).

A real daemon started with ``tgnb emulator start --time-scale 0.02`` holds a live LoRA resource
with 2 training sessions; it is SIGKILLed while an operation runs, left down a few seconds, and
started again with a bare ``tgnb emulator start``. It must come back on the same port at the same
time scale, so the SDK client objects made before the kill (whose base URL is fixed) go on; each
session says it was rolled back (metadata and a timeline event, steps from and to); tgnb's handle
re-reads the step; the GPU time billed up to the kill is kept and the downtime is not billed.
Nothing is faked: the daemon, the SDK and the CLI are the real ones.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from together.post_training import AdamParams, ModelResourcesClient, Sample

from tests.conftest import wait_until
from tgnb import events as ev
from tgnb.emulator import daemon
from tgnb.emulator.admin import AdminClient
from tgnb.events import parse_time

from .conftest import TINY

SAMPLES = [
    Sample(
        model_input={"chunks": [{"encoded_text": {"tokens": [1, 7, 8, 9, 10]}}]},
        loss_fn_inputs={"target_tokens": [7, 8, 9, 10, 11], "weights": [1.0] * 5},
    )
]
SCALE = 0.02
DOWN_S = 4.0


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tgnb.emulator.cli", "start", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def _steps(sess: Any, n: int) -> None:
    for _ in range(n):
        sess.trainer.forward_backward(samples=SAMPLES, loss={"type": "cross_entropy"})
        sess.trainer.optim_step(adam_params=AdamParams(learning_rate=0.005))


@pytest.mark.slow
def test_sigkill_then_bare_start_is_transparent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "tgnb-test-transparent-key"
    home = tmp_path
    monkeypatch.setenv("TGNB_HOME", str(home))
    monkeypatch.setenv("TGNB_EMULATOR_API_KEY", key)
    monkeypatch.setenv("TOGETHER_API_KEY", key)
    monkeypatch.setenv("TOGETHER_DISABLE_VERSION_CHECK", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cli(home, "--time-scale", str(SCALE), "--drain-window-s", "120")
    try:
        st = daemon.status(home)
        assert st.running and st.base_url
        monkeypatch.setenv("TOGETHER_BASE_URL", st.base_url)
        mr = ModelResourcesClient.create(base_model=TINY, interval=0.1)
        rid = mr.model_resources_id
        a = mr.create_session(lora_config={"rank": 4}, interval=0.1)
        b = mr.create_session(lora_config={"rank": 4}, interval=0.1)
        _steps(a, 3)
        ck_a = a.create_training_checkpoint()
        _steps(a, 2)  # step 5: lost with the daemon
        _steps(b, 1)
        ck_b = b.create_training_checkpoint()
        _steps(b, 1)  # step 2: lost

        from tgnb.posttraining import post_training

        pt = post_training(home=home)
        res = pt.attach(rid)
        handle = res.session(a.session_id)
        assert handle.step == 5

        with AdminClient(st.base_url, key) as admin:
            before = admin.rl_usage(rid)
        t_before = time.time()
        # at the per-operation caps (512 samples, 30,720 of 32,768 tokens): seconds of work, so the
        # poll below sees it running (64 five-token samples could end between two polls)
        tokens = [1 + i % 50 for i in range(61)]
        long = Sample(
            model_input={"chunks": [{"encoded_text": {"tokens": tokens[:-1]}}]},
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 60},
        )
        big = [long] * 512
        inflight = threading.Thread(  # an operation running when the daemon dies
            target=lambda: _swallow(
                lambda: a.trainer.forward_backward(samples=big, loss={"type": "cross_entropy"})
            ),
            daemon=True,
        )
        inflight.start()
        with AdminClient(st.base_url, key) as admin:
            running = lambda: admin.health()["rl_operations_running"] > 0  # noqa: E731
            wait_until(running, 60, what="the forward_backward to run", every=0.02)
        os.kill(st.pid, signal.SIGKILL)
        wait_until(lambda: not daemon.status(home).running, 10)
        t_kill = time.time()
        time.sleep(DOWN_S)

        out = _cli(home)  # bare: no option given
        again = daemon.status(home)
        t_up = time.time()
        assert again.port == st.port, out.stdout
        assert (again.options or {})["time_scale"] == SCALE
        assert (again.options or {})["drain_window_s"] == 120
        assert "time scale 0.02" in out.stdout
        inflight.join(60)

        # the same SDK objects continue: their base URL is still valid
        wait_until(lambda: a.retrieve().status.endswith("RUNNING"))
        wait_until(lambda: b.retrieve().status.endswith("RUNNING"))
        assert str(a.retrieve().step) == "3" and str(b.retrieve().step) == "1"
        meta = a.retrieve().metadata.to_dict()
        assert meta["emulator_rollbacks"][-1]["from_step"] == 5
        assert meta["emulator_rollbacks"][-1]["to_step"] == 3
        assert meta["emulator_rollbacks"][-1]["checkpoint"] == ck_a.id
        assert "from step 5" in meta["emulator_restart"]
        _steps(a, 1)
        _steps(b, 1)
        assert str(a.retrieve().step) == "4" and str(b.retrieve().step) == "2"

        # tgnb's handle re-reads the step; the rollback is on the resource's timeline
        assert handle.step == 4
        rolled = [e for e in res.events() if e.reason == ev.SESSION_ROLLED_BACK]
        by_session = {e.data["session"]: e.data for e in rolled}
        assert by_session[a.session_id]["from_step"] == 5
        assert by_session[a.session_id]["to_step"] == 3
        assert by_session[b.session_id]["from_step"] == 2
        assert by_session[b.session_id]["checkpoint"] == ck_b.id

        # billing: what accrued up to the kill is kept, the downtime is not billed
        with AdminClient(again.base_url or "", key) as admin:
            after = admin.rl_usage(rid)
        t_after = time.time()
        gpus = after["gpus"]
        assert after["clock"] == "platform" and after["time_scale"] == SCALE
        assert after["unbilled_downtime_s"] >= DOWN_S - 1.5
        restarted = parse_time(after["billing_since"]).timestamp()
        assert t_kill - 0.5 < restarted < t_up
        # before the kill: what was billed then, plus at most the seconds to the kill
        kept = after["billed_before_s"] - before["gpu_seconds"]
        assert -gpus * 1.5 / SCALE <= kept <= gpus * (t_kill - t_before + 0.5) / SCALE
        # after the restart: only the seconds since it; the downtime (>= DOWN_S) is in neither
        assert after["gpu_seconds"] - after["billed_before_s"] <= (
            gpus * (t_after - restarted + 0.5) / SCALE
        )
        assert after["unbilled_downtime_s"] == pytest.approx(restarted - t_kill, abs=1.5)
        mr.stop(force=True)
    finally:
        daemon.stop(home)


def _swallow(fn: Any) -> None:
    # the daemon died under it: what it answers after is not what this test checks
    with contextlib.suppress(Exception):
        fn()


@pytest.mark.slow
def test_asked_options_win_over_the_crashed_ones(tmp_path: Path) -> None:
    """A bare start restores; an asked option is used as asked (no error: nothing runs)."""
    home = tmp_path
    eh = daemon.emulator_home(home)
    eh.mkdir(parents=True)
    from tgnb.emulator.store import atomic_write_json
    from tgnb.emulator.testing import free_port

    port = free_port()
    recorded = daemon.ServeOptions.of(time_scale=0.05, drain_window_s=60.0, port=0).flat()
    gone = subprocess.Popen(["true"])  # a pid that was a process's and is no longer
    gone.wait()
    atomic_write_json(eh / "server.json", {"pid": gone.pid, "port": port, "options": recorded})
    opts = daemon.after_crash(eh, daemon.ServeOptions(), asked=[])
    assert opts.port == port and opts.fleet.time_scale == 0.05
    assert opts.fleet.drain_window_s == 60.0
    opts = daemon.after_crash(eh, daemon.ServeOptions.of(time_scale=1.0), asked=["time_scale"])
    assert opts.fleet.time_scale == 1.0 and opts.fleet.drain_window_s == 60.0
    asked = daemon.ServeOptions.of(time_scale=0.5, port=0)
    opts = daemon.after_crash(eh, asked, asked=None)  # the Python API: every option asked
    assert opts.fleet.time_scale == 0.5 and opts.port == port
    (eh / "server.json").unlink()  # a clean stop leaves no record: defaults
    assert daemon.after_crash(eh, daemon.ServeOptions(), asked=[]).fleet.time_scale == 1.0
