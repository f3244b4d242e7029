"""What `tgnb.train.protect` costs a user's Trainer, as ratios taken side by side in one run.

(a) step time of a plain TRL SFTTrainer with ``protect()`` / without (target <= 1.02): the same
    script (tests/workload/user_workdir/train.py, TRL's quickstart plus one line) run with and
    without the line, alternately, `--rounds` times each; the median step time of each run from the
    Trainer's own step callbacks (the first `--warmup` steps left out), then the median over rounds.
(b) SIGTERM -> sealed checkpoint of that protected user Trainer / of the built-in runtime
    (``python -m tgnb.train``, algorithm sft), same tiny model, batch and ranks (target <= 1.1):
    SIGTERM sent from here once a run has logged `--at` steps, until the checkpoint's completion
    marker exists, alternately, `--rounds` times each. Both sides protect an SFTTrainer through the
    same runtime (`tgnb.train.protect`) and write the same checkpoint; what differs is the step in
    flight when the signal lands, which the signal has to wait for. So that it costs the same on
    both sides, the user's SFTConfig gets every training argument the built-in runtime gives the
    tiny model on the CPU (`tgnb.train.runner.training_kwargs`) that the script does not set itself
    -- today ``bf16=False`` (TRL's SFTConfig defaults to bf16, whose autocast makes a tiny CPU step
    2-3x slower), ``activation_checkpointing=False``, ``disable_tqdm=True`` and the seed. Per side
    it also prints where the time went, from the run's own ``events.jsonl``: signal delivered
    (``SignalReceived.received_at``), step in flight finished (that event's time, written at the
    step boundary), shards and small files written (``CheckpointSaved.stall_s``), checksums and
    marker (``duration_s`` - ``stall_s``), and the rest (about 0: a few ms below, as ``duration_s``
    ends after the marker's fsync, past its mtime).

Usage: ``python bench/protect.py [--rounds 3] [--steps 40]``. The tiny model on the CPU is the
demo scale; on a cluster the same ratios are taken with ``--model`` a real model.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
USER = ROOT / "tests" / "workload" / "user_workdir"
STEP_TIMER = """
import time, statistics, json, sys
from transformers import TrainerCallback
class _Timer(TrainerCallback):
    def __init__(self): self.t = []; self.began = None
    def on_step_begin(self, args, state, control, **kw): self.began = time.perf_counter()
    def on_step_end(self, args, state, control, **kw): self.t.append(time.perf_counter() - self.began)
"""


BUILTIN_SETS = ("algorithm=sft", "trl.per_device_train_batch_size=8")


def _builtin_args(script: str) -> str:
    """The training arguments the built-in runtime gives the tiny model (`BUILTIN_SETS`) on the CPU
    that `script`'s ``SFTConfig(...)`` does not set itself, as keyword-argument source."""
    from tgnb.tasks.config import TrainConfig
    from tgnb.train.runner import training_kwargs

    cfg = TrainConfig(algorithm="sft", model="tiny", trl={"per_device_train_batch_size": 8})
    block = script[script.index("SFTConfig(") :]
    block = block[: block.index("\n)")]
    given = set(re.findall(r"\b(\w+)=", block))
    return " ".join(f"{k}={v!r}," for k, v in training_kwargs(cfg, False).items() if k not in given)


def _workdir(tmp: Path, protect: bool, timer: bool, same_args: bool = False) -> Path:
    wd = tmp / f"wd-{protect}-{time.monotonic_ns()}"
    shutil.copytree(USER, wd, ignore=shutil.ignore_patterns("__pycache__"))
    with open(wd / "data.jsonl", "w", encoding="utf-8") as fh:
        for i in range(2000):
            fh.write(json.dumps({"a": i % 3, "b": (i // 3) % 3}) + "\n")
    text = (wd / "train.py").read_text()
    if not protect:
        text = text.replace("tgnb.train.protect(trainer)\n", "")
    if same_args:
        text = text.replace("use_cpu=True,", "use_cpu=True, " + _builtin_args(text))
    if timer:
        text = STEP_TIMER + text.replace(
            "trainer.train()\n",
            "_timer = _Timer(); trainer.add_callback(_timer)\ntrainer.train()\n"
            "print('STEP_TIMES', json.dumps(_timer.t))\n",
        )
    (wd / "train.py").write_text(text)
    return wd


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env.update(TGNB_HOME=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


def step_time(tmp: Path, model: str, protect: bool, steps: int, warmup: int) -> float:
    wd = _workdir(tmp, protect, timer=True)
    cmd = [sys.executable, "train.py", "--model", model, "--max-steps", str(steps)]
    out = subprocess.run(cmd, cwd=wd, env=_env(tmp), capture_output=True, text=True, check=True)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("STEP_TIMES"))
    times = json.loads(line.split(" ", 1)[1])[warmup:]
    return statistics.median(times)


def _marker_after(ckpts: Path, sent: float, timeout: float = 300.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for marker in ckpts.glob("checkpoint-*/tgnb-complete.json"):
            if marker.stat().st_mtime >= sent:
                return marker.stat().st_mtime - sent
        time.sleep(0.005)
    raise RuntimeError(f"no checkpoint sealed in {ckpts} after the SIGTERM")


def _breakdown(run_dir: Path, sent: float, took: float) -> dict[str, float]:
    """Where the time from `sent` to the marker went, from the run's events (seconds)."""
    from tgnb.events import parse_time, read_jsonl

    events = {ev.reason: ev for ev in read_jsonl(run_dir / "events.jsonl")}
    got, saved = events["SignalReceived"], events["CheckpointSaved"]
    received = parse_time(got.data["received_at"]).timestamp()
    boundary = parse_time(got.time).timestamp()
    stall, duration = float(saved.data["stall_s"]), float(saved.data["duration_s"])
    return {
        "signal": received - sent,
        "step": boundary - received,
        "write": stall,
        "seal": duration - stall,
        "rest": took - (boundary - sent) - duration,
    }


def sigterm_to_sealed(
    tmp: Path, model: str, user: bool, at: int, steps: int
) -> tuple[float, dict[str, float]]:
    if user:
        wd = _workdir(tmp, protect=True, timer=False, same_args=True)
        cmd = [sys.executable, "train.py", "--model", model, "--max-steps", str(steps)]
        run_dir, cwd = wd / "out", wd
    else:
        run_dir = tmp / f"builtin-{time.monotonic_ns()}"
        sets = [*BUILTIN_SETS, f"max_steps={steps}"]
        cmd = [sys.executable, "-m", "tgnb.train", "--run-dir", str(run_dir)]
        cmd += [a for s in sets for a in ("--set", s)]
        cwd = tmp
    proc = subprocess.Popen(cmd, cwd=cwd, env=_env(tmp), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    try:
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= at):
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended before step {at}: {cmd}")
            time.sleep(0.01)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        took = _marker_after(run_dir / "checkpoints", sent)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return took, _breakdown(run_dir, sent, took)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--at", type=int, default=5, help="(b): SIGTERM once this many steps logged")
    p.add_argument("--model", default=None, help="a model path or id (default: the tiny model)")
    p.add_argument("--part", choices=("a", "b", "both"), default="both")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from tgnb.tasks import assets

    tmp = Path(tempfile.mkdtemp(prefix="tgnb-bench-protect-"))
    model = args.model or assets.resolve_model("tiny")
    plain: list[float] = []
    guarded: list[float] = []
    user: list[tuple[float, dict[str, float]]] = []
    builtin: list[tuple[float, dict[str, float]]] = []
    try:
        for _ in range(args.rounds):  # side by side: one of each per round
            if args.part in ("a", "both"):
                guarded.append(step_time(tmp, model, True, args.steps, args.warmup))
                plain.append(step_time(tmp, model, False, args.steps, args.warmup))
            if args.part in ("b", "both"):
                user.append(sigterm_to_sealed(tmp, model, True, args.at, 10 * args.steps))
                builtin.append(sigterm_to_sealed(tmp, model, False, args.at, 10 * args.steps))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ms = lambda xs: " ".join(f"{x * 1000:.1f}" for x in xs)  # noqa: E731
    if guarded:
        a = statistics.median(guarded) / statistics.median(plain)
        print(f"(a) step time, protected / plain SFTTrainer: {a:.3f}  (target <= 1.02)")
        print(f"    ms protected: {ms(guarded)}; plain: {ms(plain)}")
    if user:
        mine, theirs = [t for t, _ in user], [t for t, _ in builtin]
        b = statistics.median(mine) / statistics.median(theirs)
        print(
            f"(b) SIGTERM -> sealed checkpoint, user Trainer / built-in: {b:.3f}  (target <= 1.1)"
        )
        print(f"    ms user: {ms(mine)}; built-in: {ms(theirs)}")
        for side, runs in (("user", user), ("built-in", builtin)):
            parts = ", ".join(f"{k} {ms([p[k] for _, p in runs])}" for k in runs[0][1])
            print(f"    {side} ms by part: {parts}")


if __name__ == "__main__":
    main()
