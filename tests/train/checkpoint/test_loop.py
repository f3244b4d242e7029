"""`tgnb.train.Checkpointer`: a user's plain PyTorch loop (`loop_script.py`: nn.Linear, Adam, StepLR,
a seeded data order added with ``add_state``, noise from the global RNG) checkpointed, preempted and
resumed by tgnb's real machinery (the guard's flags and choice, the Saver, DCP).

Real torch, real torchrun (``python -m tgnb.train.launch``, gloo on the CPU, DDP), real signals;
nothing of tgnb faked. The slow tests run the script as processes and compare the final parameters
with those of an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.errors import TrainConfigError
from tgnb.runs.node import CHECKPOINT_ENV, RUN_DIR_ENV, Exit
from tgnb.train import checkpoint as ck

from .conftest import read_jsonl, worker_pids

SCRIPT = Path(__file__).with_name("loop_script.py")
STEPS = 24


class Procs:
    """The script's processes (each in a session of its own; killed at the end if still there)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "TGNB_HOME": str(tmp_path / "home")}
        for name in (RUN_DIR_ENV, CHECKPOINT_ENV, "TGNB_RUN", "TGNB_NOTICE_FILE", "SLURM_JOB_ID"):
            self.env.pop(name, None)
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str, ranks: int = 0, env: dict[str, str] | None = None) -> Any:
        launch = [sys.executable]
        if ranks:
            launch += ["-m", "tgnb.train.launch", "--standalone", f"--nproc_per_node={ranks}"]
        log = self.tmp_path / f"proc-{len(self.started)}.log"
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [*launch, str(SCRIPT), *args],
                stdout=fh,
                stderr=subprocess.STDOUT,
                text=True,
                env={**self.env, **(env or {})},
                start_new_session=True,
            )
        proc.log = log  # type: ignore[attr-defined]
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()


def finish(proc: Any, timeout: float = 300) -> int:
    try:
        return int(proc.wait(timeout=timeout))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"no exit in {timeout} s:\n{tail(proc)}") from None


def tail(proc: Any, n: int = 3000) -> str:
    return str(proc.log.read_text()[-n:])


def steps(run_dir: Path) -> list[int]:
    return [int(r["step"]) for r in read_jsonl(run_dir / "metrics.jsonl")]


def events(run_dir: Path, reason: str) -> list[dict[str, Any]]:
    return [e["data"] for e in read_jsonl(run_dir / "events.jsonl") if e["reason"] == reason]


def wait_rows(proc: Any, run_dir: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := steps(run_dir)) and max(got) >= step:
            return
        assert proc.poll() is None, f"exited {proc.returncode} early:\n{tail(proc)}"
        time.sleep(0.05)
    raise AssertionError(f"step {step} not logged in {timeout} s:\n{tail(proc)}")


def stopped_at(proc: Any, ranks: int) -> int:
    found = re.findall(r"tgnb: rank (\d) preempted at step (\d+)", proc.log.read_text())
    at = {int(r): int(s) for r, s in found}
    assert sorted(at) == list(range(ranks)) and len(set(at.values())) == 1, tail(proc)
    return next(iter(at.values()))


def max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    assert x.keys() == y.keys()
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def assert_sealed(run_dir: Path, step: int, world: int) -> None:
    latest = ck.latest_complete(run_dir / "checkpoints")
    assert latest is not None and latest.step == step
    saved = events(run_dir, "CheckpointSaved")[-1]
    assert (saved["step"], saved["trigger"], saved["world_size"]) == (step, "signal", world)
    names = {f.path for f in latest.files}
    assert {"loop.json", "optimizer.json", "scheduler.json", "dcp/.metadata"} <= names
    assert {f"rng-{r}.safetensors" for r in range(world)} <= names
    loop = json.loads((latest.path / "loop.json").read_text())
    assert loop["step"] == step and loop["states"]["data"]["pos"] >= 0


@pytest.mark.slow
def test_two_ranks_on_the_cpu_with_the_default_backend_stop_together_and_resume(
    procs: Procs, tmp_path: Path
) -> None:
    """``init_process_group()`` with no backend (what PyTorch's DDP tutorial writes): on a
    machine without a GPU the stop flags' collective runs on the CPU (it asked for a GPU)."""
    run_dir = tmp_path / "run"
    args = ("--dir", str(run_dir), "--steps", str(STEPS), "--sleep", "0.05", "--default-backend")
    proc = procs.start(*args, ranks=2)
    wait_rows(proc, run_dir, 3)
    pids = worker_pids(proc.pid)
    os.kill(pids[1], signal.SIGTERM)  # one rank signalled: both stop at the same step
    assert finish(proc) == Exit.PREEMPTED, tail(proc)
    at = stopped_at(proc, 2)
    assert_sealed(run_dir, at, 2)
    again = procs.start(*args, ranks=2)
    assert finish(again) == 0, tail(again)
    assert sorted(set(steps(run_dir))) == list(range(1, STEPS + 1))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_torchrun_two_ranks_preempted_resume_equals_uninterrupted_and_resumes_at_one_rank(
    procs: Procs, tmp_path: Path
) -> None:
    """Under tgnb's node contract ($TGNB_RUN_DIR wins over --dir; $TGNB_CHECKPOINT over the
    script's every_steps), SIGTERM to rank 1 only: both ranks stop at the same step, the launcher
    exits 75 with a sealed checkpoint; restarted it finishes with every step logged once and the
    uninterrupted run's parameters (1e-6); the same checkpoint resumed at one rank (plain python)
    finishes there too."""
    ignored = tmp_path / "ignored"
    common = ("--dir", str(ignored), "--steps", str(STEPS), "--every", "100")

    def env(name: str) -> dict[str, str]:
        return {RUN_DIR_ENV: str(tmp_path / name), CHECKPOINT_ENV: '{"every_steps": 5}'}

    ref = procs.start(*common, "--out", str(tmp_path / "ref.st"), ranks=2, env=env("ref"))
    assert finish(ref) == 0, tail(ref)
    run_dir = tmp_path / "run"
    run = procs.start(*common, "--sleep", "0.3", ranks=2, env=env("run"))
    wait_rows(run, run_dir, 7)
    pids = worker_pids(run.pid)
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[1], signal.SIGTERM)
    assert finish(run) == Exit.PREEMPTED, tail(run)
    stop = stopped_at(run, 2)
    assert 7 <= stop < STEPS
    assert_sealed(run_dir, stop, 2)
    assert [e["step"] for e in events(run_dir, "CheckpointSaved")][:1] == [5]  # the launch's 5
    assert not ignored.exists()
    shutil.copytree(run_dir, tmp_path / "one")

    again = procs.start(*common, "--out", str(tmp_path / "run.st"), ranks=2, env=env("run"))
    assert finish(again) == 0, tail(again)
    assert [e["step"] for e in events(run_dir, "RunResumed")] == [stop]
    assert sorted(steps(run_dir)) == list(range(1, STEPS + 1))
    diff = max_diff(tmp_path / "ref.st", tmp_path / "run.st")
    assert diff <= 1e-6, f"max abs difference {diff} after a stop at {stop}"

    one = procs.start(*common, "--out", str(tmp_path / "one.st"), env=env("one"))
    assert finish(one) == 0, tail(one)
    resumed = events(tmp_path / "one", "RunResumed")
    assert [(e["step"], e["world_size"], e["saved_world_size"]) for e in resumed] == [(stop, 1, 2)]
    diff = max_diff(tmp_path / "ref.st", tmp_path / "one.st")
    assert diff <= 1e-6, f"1 rank from 2: max abs difference {diff}"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plain_python_outside_tgnb_preempted_twice_and_a_bad_checkpoint_quarantined(
    procs: Procs, tmp_path: Path
) -> None:
    """No tgnb environment: the script checkpoints into its --dir. SIGTERM: a sealed checkpoint
    and exit 75; run again it resumes there; preempted again, its newest checkpoint is then
    damaged (bytes flipped, size kept): the next start quarantines it, resumes from the one
    before and finishes with the uninterrupted run's parameters."""
    out = tmp_path / "out"
    common = ("--dir", str(out), "--steps", str(STEPS), "--every", "2")
    ref = procs.start(*common[2:], "--dir", str(tmp_path / "ref"), "--out", str(tmp_path / "r.st"))
    assert finish(ref) == 0, tail(ref)
    stops = []
    for at in (5, 12):
        run = procs.start(*common, "--sleep", "0.3")
        wait_rows(run, out, at)
        run.send_signal(signal.SIGTERM)
        assert finish(run) == Exit.PREEMPTED, tail(run)
        stops.append(stopped_at(run, 1))
        assert_sealed(out, stops[-1], 1)
    assert [e["step"] for e in events(out, "RunResumed")] == stops[:1]
    newest = out / "checkpoints" / f"checkpoint-{stops[1]}"
    shard = newest / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    last = procs.start(*common, "--out", str(tmp_path / "o.st"))
    assert finish(last) == 0, tail(last)
    rejected = events(out, "CheckpointRejected")
    assert len(rejected) == 1 and "checksum mismatch" in rejected[0]["cause"], rejected
    moved = Path(rejected[0]["moved_to"])
    assert moved.parent == out / "checkpoints" / ck.QUARANTINE and (moved / "REASON.txt").exists()
    back = events(out, "RunResumed")[-1]["step"]
    assert stops[1] - 2 <= back < stops[1]  # the periodic save before the damaged one
    assert set(steps(out)) == set(range(1, STEPS + 1))
    diff = max_diff(tmp_path / "r.st", tmp_path / "o.st")
    assert diff <= 1e-6, f"max abs difference {diff} after stops at {stops} and a quarantine"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp2_two_ranks_preempted_resumes_at_one_rank_like_the_uninterrupted_run(
    procs: Procs, tmp_path: Path
) -> None:
    """FSDP2 (``fully_shard``): each rank saves its shards; SIGTERM to rank 0; the checkpoint,
    resharded by DCP, resumes at one rank (torchrun, one process) and ends where an uninterrupted
    2-rank FSDP2 run ends (1e-6)."""
    common = ("--fsdp", "--steps", str(STEPS), "--every", "100")
    ref = procs.start(*common, "--dir", str(tmp_path / "ref"), "--out", str(tmp_path / "r.st"),
                      ranks=2)  # fmt: skip
    assert finish(ref) == 0, tail(ref)
    run_dir = tmp_path / "run"
    run = procs.start(*common, "--dir", str(run_dir), "--sleep", "0.3", ranks=2)
    wait_rows(run, run_dir, 5)
    pids = worker_pids(run.pid)
    assert sorted(pids) == [0, 1], pids
    os.kill(pids[0], signal.SIGTERM)
    assert finish(run) == Exit.PREEMPTED, tail(run)
    stop = stopped_at(run, 2)
    assert_sealed(run_dir, stop, 2)
    one = procs.start(*common, "--dir", str(run_dir), "--out", str(tmp_path / "o.st"), ranks=1)
    assert finish(one) == 0, tail(one)
    resumed = events(run_dir, "RunResumed")
    assert [(e["step"], e["world_size"], e["saved_world_size"]) for e in resumed] == [(stop, 1, 2)]
    diff = max_diff(tmp_path / "r.st", tmp_path / "o.st")
    assert diff <= 1e-6, f"FSDP2, 1 rank from 2: max abs difference {diff}"


@pytest.mark.timeout(600)
def test_a_loop_on_a_full_disk_exits_74_and_keeps_its_last_checkpoint(
    procs: Procs, small_disk: Path, tmp_path: Path
) -> None:
    """The loop's directory on a 2 MiB tmpfs, a checkpoint of about 0.8 MB saved every step: the
    disk fills; the script exits 74 naming the disk, its last complete checkpoint intact; with
    room again it resumes from that checkpoint and finishes."""
    out = small_disk / "out"
    common = ("--features", "35000", "--every", "1", "--steps", "30")
    run = procs.start(*common, "--dir", str(out))
    assert finish(run) == Exit.NO_SPACE, tail(run)
    log = tail(run, 20_000)
    assert "disk full" in log and str(out) in log, log
    latest = ck.latest_complete(out / "checkpoints")
    assert latest is not None, log
    roomy = tmp_path / "roomy"
    shutil.copytree(out, roomy)
    again = procs.start(*common, "--dir", str(roomy))
    assert finish(again) == 0, tail(again)
    assert [e["step"] for e in events(roomy, "RunResumed")] == [latest.step]


# -- in one process ------------------------------------------------------------------------------
def _loop(run_dir: Path, stop_at: int | None = None, **kw: Any) -> tuple[Any, list[float]]:
    import torch

    from tgnb.train.loop import Checkpointer

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    c = Checkpointer(model, opt, sched, max_steps=8, dir=run_dir, exit=False, **kw)
    for step in c.steps():
        x = torch.randn(16, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        c.log(loss=loss)
        if step == stop_at:
            c.request_stop()
    return c, [float(p) for p in model.weight.detach().flatten()]


def test_in_one_process_a_stop_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """request_stop (as SIGTERM would): exit code 75 left in `exit_code` (exit=False), a sealed
    checkpoint at that step; a new Checkpointer resumes from it (model, momentum, scheduler, RNG)
    and ends where an uninterrupted loop ends."""
    ref, want = _loop(tmp_path / "ref")
    assert ref.exit_code == 0 and ref.step == 8
    first, _ = _loop(tmp_path / "run", stop_at=3)
    assert (first.exit_code, first.step) == (Exit.PREEMPTED, 3)
    assert ck.latest_complete(tmp_path / "run" / "checkpoints").step == 3  # type: ignore[union-attr]
    second, got = _loop(tmp_path / "run")
    assert second.resumed is not None and second.resumed.step == 3 and second.exit_code == 0
    assert max(abs(a - b) for a, b in zip(want, got, strict=True)) <= 1e-6
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert all("loss" in r and "learning_rate" in r for r in rows)


def test_the_launchs_policy_wins_key_by_key_and_bad_input_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from tgnb.runs.policy import CheckpointPolicy
    from tgnb.train.loop import Checkpointer

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with monkeypatch.context() as m:
        m.setenv(CHECKPOINT_ENV, '{"every_steps": 10, "keep_last": 4}')
        m.setenv(RUN_DIR_ENV, str(tmp_path / "launched"))
        c = Checkpointer(model, opt, max_steps=3, dir=tmp_path / "mine",
                         checkpoint={"every_steps": 50, "async_save": False})  # fmt: skip
        c.guard.close()
    got = c.policy
    assert (got.every_steps, got.keep_last, got.async_save) == (10, 4, False)
    assert c.run_dir == tmp_path / "launched" and c.checkpoint_dir.parent == c.run_dir
    c = Checkpointer(model, opt, max_steps=3, dir=tmp_path, checkpoint=CheckpointPolicy(auto=True))
    c.guard.close()
    assert c.policy.auto and c.run_dir == tmp_path
    with pytest.raises(TrainConfigError, match="Did you mean 'every_steps'"):
        Checkpointer(model, opt, max_steps=3, dir=tmp_path, checkpoint={"every_step": 5})
    with pytest.raises(TrainConfigError, match="keep_last"):
        Checkpointer(model, opt, max_steps=3, dir=tmp_path, checkpoint={"keep_last": 0})
    with pytest.raises(TrainConfigError, match="dir='out'"):
        Checkpointer(model, opt, max_steps=3)
    with pytest.raises(TrainConfigError, match="max_steps"):
        Checkpointer(model, opt, max_steps=0, dir=tmp_path)
    with monkeypatch.context() as m:  # a torchrun worker that has not started torch.distributed
        m.setenv("WORLD_SIZE", "2")
        with pytest.raises(TrainConfigError, match="init_process_group"):
            Checkpointer(model, opt, max_steps=3, dir=tmp_path)
    c = Checkpointer(model, opt, max_steps=3, dir=tmp_path)
    try:

        class Holder:
            def state_dict(self) -> dict[str, Any]:
                return {"t": torch.zeros(2)}

            def load_state_dict(self, d: dict[str, Any]) -> None: ...

        with pytest.raises(TrainConfigError, match="not plain JSON"):
            c.add_state("bad", Holder())
        with pytest.raises(TrainConfigError, match="state_dict"):
            c.add_state("none", object())
    finally:
        c.guard.close()


def test_tgnb_train_stays_light_until_checkpointer_is_used() -> None:
    code = (
        "import sys, tgnb.train as t; assert 'torch' not in sys.modules, 'torch'; "
        "t.Checkpointer; assert 'torch' in sys.modules and 'transformers' not in sys.modules"
    )
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]


def test_an_accelerate_loop_stops_and_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    """The objects ``Accelerator.prepare`` returns (its optimizer and scheduler wrappers; one
    process, CPU) checkpoint and resume like plain ones."""
    pytest.importorskip("accelerate")
    import torch
    from accelerate import Accelerator

    from tgnb.train.loop import Checkpointer

    def loop(run_dir: Path, stop_at: int | None = None) -> tuple[Any, Any]:
        acc = Accelerator(cpu=True)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
        model, opt, sched = acc.prepare(model, opt, sched)
        c = Checkpointer(model, opt, sched, max_steps=6, dir=run_dir, exit=False)
        for step in c.steps():
            x = torch.randn(8, 4)
            acc.backward(((model(x) - x.sum(1, keepdim=True)) ** 2).mean())
            opt.step()
            sched.step()
            opt.zero_grad()
            if step == stop_at:
                c.request_stop()
        return c, (model.weight.detach().clone(), sched.get_last_lr())

    _, (want, lr) = loop(tmp_path / "ref")
    assert loop(tmp_path / "run", stop_at=3)[0].exit_code == Exit.PREEMPTED
    again, (got, lr_got) = loop(tmp_path / "run")
    assert again.resumed is not None and again.resumed.step == 3 and again.exit_code == 0
    assert float((want - got).abs().max()) <= 1e-6 and lr == lr_got
