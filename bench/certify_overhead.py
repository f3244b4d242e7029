"""What `tgnb certify` costs, as ratios taken side by side in one run.

(a) certify wall time / the script's uninterrupted run (aim <= 3x): the tiny Checkpointer loop of
    the certify tests (tests/certify/workdir/loop.py) run alone with ``python`` outside tgnb, then
    certified with ``tgnb certify`` (its own emulator started and stopped, an uninterrupted run and
    a chaos run side by side: a preemption during setup, one during the first save, one at a random
    step, a kill). Printed twice: the whole command, and `certify` alone (its emulator already up).
(b) step time of a Lightning ``Trainer.fit`` with ``tgnb.train.protect`` (its callback) / without
    (target <= 1.02): the Lightning script of the certify tests (tests/certify/workdir/lit.py),
    timed by a callback of its own around each training batch, alternately with and without
    protect, `--rounds` times each; the median step of each run (the first `--warmup` left out),
    then the median over rounds.

Usage: ``python bench/certify_overhead.py [--steps 80] [--lit-steps 400] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from tgnb.cli import main; sys.exit(main(sys.argv[1:]))"
WORKDIR = ROOT / "tests" / "certify" / "workdir"
TIMED = """
import runpy, statistics, sys, time
import lightning as L
import tgnb.train
class Timer(L.Callback):
    def __init__(self): self.t = []; self.began = 0.0
    def on_train_batch_start(self, *a): self.began = time.perf_counter()
    def on_train_batch_end(self, *a): self.t.append(time.perf_counter() - self.began)
timer = Timer()
protect = tgnb.train.protect
def with_timer(trainer, *a, **k):
    trainer.callbacks.append(timer)
    return protect(trainer, *a, **k)
tgnb.train.protect = with_timer
_init = L.Trainer.__init__
def init(self, *a, **k):
    _init(self, *a, **k)
    if "--no-protect" in sys.argv: self.callbacks.append(timer)
L.Trainer.__init__ = init
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print("STEP", statistics.median(timer.t[WARMUP:]))
"""


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TGNB_")}
    env["TGNB_HOME"] = str(home)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def plain_run(steps: int, tmp: Path) -> float:
    """The script alone, outside tgnb, in a copy of its folder (its checkpoints go there)."""
    wd = tmp / "plain"
    shutil.copytree(WORKDIR, wd, ignore=shutil.ignore_patterns("__pycache__", "out"))
    began = time.perf_counter()
    cmd = [sys.executable, "loop.py", "--max-steps", str(steps)]
    subprocess.run(cmd, cwd=wd, env=_env(tmp), check=True, capture_output=True)
    return time.perf_counter() - began


def certify_run(steps: int, tmp: Path) -> tuple[float, float, str]:
    """(the whole ``tgnb certify`` command, `certify` alone, the certificate's verdict line)"""
    began = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CLI, "certify", "--workdir", str(WORKDIR), "--seed", "1",
         "loop.py", "--max-steps", str(steps)],
        env=_env(tmp), capture_output=True, text=True, check=False,
    )  # fmt: skip
    whole = time.perf_counter() - began
    head = next((ln for ln in out.stdout.splitlines() if ln.startswith("tgnb certify")), "")
    if not head:
        sys.exit(f"tgnb certify printed no certificate:\n{out.stdout}\n{out.stderr}")
    alone = float(head.rsplit("(", 1)[1].split(" s", 1)[0])
    return whole, alone, head


def lightning_step(protect: bool, steps: int, warmup: int, tmp: Path) -> float:
    script = tmp / "timed.py"
    script.write_text(TIMED.replace("WARMUP", str(warmup)))
    args = [sys.executable, str(script), str(WORKDIR / "lit.py"), "--max-steps", str(steps),
            "--out", str(tmp / f"out-{protect}-{time.monotonic_ns()}")]  # fmt: skip
    if not protect:
        args.append("--no-protect")
    out = subprocess.run(args, env=_env(tmp), capture_output=True, text=True, check=True)
    return float(next(ln for ln in out.stdout.splitlines() if ln.startswith("STEP")).split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--lit-steps", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tgnb-bench-certify-") as d:
        tmp = Path(d)
        plain = plain_run(a.steps, tmp)
        whole, alone, head = certify_run(a.steps, tmp)
        print(f"(a) {head}")
        print(f"    the script alone: {plain:.1f} s; tgnb certify: {whole:.1f} s "
              f"({whole / plain:.2f}x, aim <= 3x); certify alone: {alone:.0f} s "
              f"({alone / plain:.2f}x)", flush=True)  # fmt: skip
        steps: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(a.rounds):
            for protect in (False, True):
                steps[protect].append(lightning_step(protect, a.lit_steps, a.warmup, tmp))
    on, off = statistics.median(steps[True]), statistics.median(steps[False])
    print(f"(b) Lightning step with protect {on * 1e3:.3f} ms / without {off * 1e3:.3f} ms: "
          f"{on / off:.3f} (target <= 1.02); rounds {a.rounds}")  # fmt: skip


if __name__ == "__main__":
    main()
