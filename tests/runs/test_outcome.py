"""`tgnb.runs.outcome`: an attempt read from the records the runtime writes (the real `Recorder`),
then classified by them first and by the exit code second."""

from __future__ import annotations

from pathlib import Path

from tgnb.events import CHECKPOINT_SAVED, RUN_EXITED, RUN_STARTED
from tgnb.runs.outcome import Attempt, classify, events_size, node_exit
from tgnb.train.record import Recorder


def _preempted(run_dir: Path, step: int = 7) -> None:
    rec = Recorder(run_dir)
    rec.event(RUN_STARTED, "started")
    rec.metric(step, loss=1.0)
    rec.event(CHECKPOINT_SAVED, "saved", step=step, trigger="signal")
    rec.event(RUN_EXITED, f"preempted at step {step}", exit_reason="preempted", exit_code=75,
              step=step, checkpoint_step=step)  # fmt: skip
    rec.close()


def test_a_launchers_1_or_143_after_a_sealed_checkpoint_is_a_preemption(tmp_path: Path) -> None:
    _preempted(tmp_path)
    for code in (1, 143, -9):
        v = classify(code, Attempt.read(tmp_path))
        assert (v.kind, v.code, v.sealed, v.line) == (
            "preempted",
            75,
            7,
            "sealed checkpoint at step 7",
        )
        assert node_exit(tmp_path, code, 0) == 75
    after = events_size(tmp_path)  # a later attempt does not see this one's record
    assert node_exit(tmp_path, 1, after) == 1
    assert classify(1, Attempt.read(tmp_path, after)).kind == "failed"


def test_exit_0_after_a_signal_with_no_checkpoint_is_not_a_success(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    for step in range(1, 13):
        rec.metric(step)
    rec.close()
    attempt = Attempt.read(tmp_path)
    assert not attempt.protected and attempt.last_step == 12
    v = classify(0, attempt, signalled=True)
    assert (v.kind, v.code, v.steps_lost) == ("unsaved", 75, 12)
    assert v.line == "stopped without a checkpoint at step 12: 12 steps lost"
    assert classify(0, attempt).kind == "succeeded"  # not signalled: done


def test_a_finished_record_or_a_failure_reads_as_it_says(tmp_path: Path) -> None:
    rec = Recorder(tmp_path)
    rec.event(RUN_STARTED, "started")
    rec.event(RUN_EXITED, "failed: ValueError: bad", exit_reason="failed", exit_code=1)
    rec.close()
    v = classify(1, Attempt.read(tmp_path))
    assert (v.kind, v.code, v.line) == ("failed", 1, "failed: ValueError: bad")
    assert classify(1, Attempt.read(tmp_path), signalled=True).kind == "preempted"
    since = events_size(tmp_path)
    rec.event(RUN_EXITED, "finished at step 3", exit_reason="finished", exit_code=0)
    rec.close()
    assert classify(0, Attempt.read(tmp_path, since), signalled=True).kind == "succeeded"


def test_a_launcher_signalled_records_an_unsaved_stop_that_every_reader_sees(
    tmp_path: Path,
) -> None:
    """torchrun's agent got tgnb's SIGTERM and its program saved nothing (it exited 0, which the
    agent reports as 143, or died of the signal): `python -m tgnb.train.launch` records the stop
    and exits 75, so Slurm and Kubernetes, which read exit codes only, restart it uncounted, and
    the local supervisor and the cockpit read the same verdict from the record."""
    from tgnb.runs.outcome import UNSAVED, node_unsaved
    from tgnb.train.launch import record_unsaved

    rec = Recorder(tmp_path)
    rec.event(CHECKPOINT_SAVED, "saved", step=4, trigger="periodic")
    for step in range(1, 11):
        rec.metric(step)
    rec.close()
    for code in (143, 1, 0):
        verdict = node_unsaved(tmp_path, code, 0)
        assert verdict is not None and (verdict.kind, verdict.code) == ("unsaved", 75)
    assert verdict.line == "stopped without a checkpoint at step 10: 6 steps lost"
    record_unsaved(str(tmp_path), verdict)
    attempt = Attempt.read(tmp_path)
    assert attempt.exit_reason == UNSAVED
    v = classify(75, attempt)  # what the local supervisor sees: the launcher's 75
    assert (v.kind, v.steps_lost, v.line) == ("unsaved", 6, verdict.line)
    _preempted(tmp_path / "sealed")  # a sealed checkpoint: no unsaved stop, whatever the code
    assert node_unsaved(tmp_path / "sealed", 143, 0) is None
