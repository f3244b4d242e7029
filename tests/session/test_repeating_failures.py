"""A failure every start would repeat fails the run at its first attempt, with its line, on the
local engine: real emulator over HTTP, the real supervisor, the user's script in its own process.
A lazy ``import`` of a module that is not installed and ``.cuda()`` on a node with no GPU each
failed the same way four times (three restarts, 111-245 s of node time) before. The node's tgnb
process exits `Exit.REPEATS` (78), final for every engine's recovery policy (the sbatch script and
the pod failure policy read the same `FINAL_CODES`); a failure that may pass is still restarted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.events import RUN_EXITED, RUN_FAILED_RESTARTING
from tgnb.runs.node import Exit
from tgnb.runs.outcome import failure_line, repeats
from tgnb.runs.recovery import FINAL_CODES, RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import JobState, JobStatus
from tgnb.session import Session

SCRIPTS = {
    "lazy-import": (
        "def load():\n    import tgnb_no_such_module  # noqa\n\nprint('step 1', flush=True)\nload()\n",
        "ModuleNotFoundError: No module named 'tgnb_no_such_module'",
    ),
    "cuda": (
        "import torch\nprint('step 1', flush=True)\ntorch.zeros(1).cuda()\n",
        "CUDA",
    ),
}


def assert_final_at_first_attempt(run: Run, status: JobStatus, line: str) -> None:
    """The run failed at its first attempt with exit 78 (never restarted), its line recorded in
    RunExited and shown in its error and status with why it is final."""
    assert status.state is JobState.FAILED, run.logs()[-20:]
    assert status.exit_code == int(Exit.REPEATS), (status, run.logs()[-20:])
    assert not [e for e in run.run_events() if e.reason == RUN_FAILED_RESTARTING]
    assert run.logs().count("step 1") == 1  # one attempt
    (exited,) = [e for e in run.run_events() if e.reason == RUN_EXITED]
    assert line in exited.message and exited.data["exit_code"] == int(Exit.REPEATS)
    error = run.error() or ""
    assert line in error and "fails the same way at every start" in error, error
    assert line in status.detail, status.detail
    fix = [ln for ln in run.logs() if "fails the same way at every start: " in ln]
    assert fix and fix[-1].endswith("; not restarted"), run.logs()[-20:]  # with its fix


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SCRIPTS))
def test_a_failure_every_start_would_repeat_is_final_at_its_first_attempt(
    session: Session, tmp_path: Path, case: str
) -> None:
    source, line = SCRIPTS[case]
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "fails.py").write_text(source)
    run = session.launch(
        "fails.py", workdir=wd, name=f"repeats-{case}", recovery=RecoveryPolicy(backoff_s=0.5)
    )
    status = run.wait(timeout=180, progress=False)
    assert_final_at_first_attempt(run, status, line)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "launcher"),
    [("lazy-import", "python"), ("cuda", "python"), ("lazy-import", "torchrun")],
)
def test_a_command_whose_failure_would_repeat_is_final_at_its_first_attempt(
    session: Session, tmp_path: Path, case: str, launcher: str
) -> None:
    """The same programs as a ``command=`` (a child process of the node's tgnb, which sees only
    its exit code 1 and its stderr): final at the first attempt, the line from its traceback; under
    torchrun too (whose own ChildFailedError traceback comes last). A command failing otherwise is
    still restarted."""
    source, line = SCRIPTS[case]
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "fails.py").write_text(source)
    argv = ["python", "fails.py"]
    if launcher == "torchrun":
        argv = ["torchrun", "--standalone", "--nproc_per_node=1", "fails.py"]
    run = session.launch(command=argv, workdir=wd, name=f"repeats-cmd-{case}-{launcher}",
                         recovery=RecoveryPolicy(backoff_s=0.5))  # fmt: skip
    status = run.wait(timeout=180, progress=False)
    assert_final_at_first_attempt(run, status, line)


@pytest.mark.slow
def test_a_command_failing_otherwise_is_restarted(session: Session, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "fails.py").write_text(
        "import logging\ntry:\n    import tgnb_no_such_module  # noqa\nexcept ImportError:\n"
        "    logging.exception('optional module')\nprint('step 1', flush=True)\n"
        "raise RuntimeError('flaky network')\n"
    )
    run = session.launch(command=["python", "fails.py"], workdir=wd, name="fails-cmd",
                         recovery=RecoveryPolicy(max_restarts=1, backoff_s=0.5))  # fmt: skip
    status = run.wait(timeout=180, progress=False)
    assert status.state is JobState.FAILED and status.exit_code == 1, status
    assert run.logs().count("step 1") == 2  # restarted once
    assert len([e for e in run.run_events() if e.reason == RUN_FAILED_RESTARTING]) == 1


def test_which_failures_repeat() -> None:
    """The one rule (`repeats`) on the lines a failure leaves; its code is final everywhere."""
    assert int(Exit.REPEATS) in FINAL_CODES
    assert repeats(ModuleNotFoundError("No module named 'wandb'", name="wandb"))
    assert repeats("AssertionError: Torch not compiled with CUDA enabled")
    assert repeats("RuntimeError: Found no NVIDIA driver on your system. Please check ...")
    assert repeats("RuntimeError: No CUDA GPUs are available")
    for passing in (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "ImportError: cannot import name 'x' from partially initialized module 'y'",
        "ConnectionError: HTTPSConnectionPool(host='huggingface.co', port=443)",
        "ValueError: No module named in this text is not at the start",
    ):
        assert not repeats(passing), passing


def test_the_failure_line_of_a_commands_stderr() -> None:
    """A command's stderr: the last traceback's exception line, a launcher's own passed over."""
    lazy = (
        'step 1\nTraceback (most recent call last):\n  File "fails.py", line 5, in <module>\n'
        "    load()\n    ^^^^^^\nModuleNotFoundError: No module named 'x'\n"
    )
    assert failure_line(lazy) == "ModuleNotFoundError: No module named 'x'"
    torchrun = lazy.replace("\n", "\n[rank0]: ") + (
        'E1206 agent failed\nTraceback (most recent call last):\n  File "torchrun", line 8\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n=====\nfails.py "
        "FAILED\n"
    )
    assert failure_line(torchrun) == "ModuleNotFoundError: No module named 'x'"
    caught_then_other = lazy + "Traceback (most recent call last):\n  x\nRuntimeError: flaky\n"
    assert failure_line(caught_then_other) == "RuntimeError: flaky"
    assert failure_line("ModuleNotFoundError: No module named 'x' (printed, not raised)\n") is None
