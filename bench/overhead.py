"""Step time of a tgnb run against plain TRL on the same task, measured side by side in one run.

Both sides train the built-in tiny model on the built-in task with the same TRL options. The tgnb
side adds what `tgnb.train.runner` adds: the checkpoint guard's callbacks (step-boundary flag
check, periodic-checkpoint bookkeeping), its SIGTERM handler and drain watcher, the saver's gloo
group and CPU staging buffer (`CheckpointGuard.attach`), and the metrics
callback writing ``metrics.jsonl`` and ``@tgnb`` stdout lines (stdout goes to a log file here, as
it does under a backend). No checkpoint is saved inside the measured steps: the guard's final save
happens after the last step, which is not measured.

The two sides alternate in rounds (plain, tgnb, plain, tgnb, ...) so that load on the machine
hits both alike. The step time is the time between consecutive ``on_step_begin`` calls, so it
covers everything done between steps; the median over all measured steps of each side is
compared. Target: ratio <= 1.02.

    HF_HUB_OFFLINE=1 python bench/overhead.py [--algorithm grpo|dpo] [--rounds 6] [--steps 30]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_timer() -> Any:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Times between consecutive step starts (the last step, followed by a save, is left out)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self._last: float | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            if self._last is not None:
                self.times.append(now - self._last)
            self._last = now

    return StepTimer()


def one_side(algorithm: str, steps: int, tgnb: bool, root: Path, index: int) -> list[float]:
    """Train `steps` steps from scratch and return the step times (the first one, warm-up, dropped)."""
    import torch

    from tgnb.tasks import config
    from tgnb.train import runner
    from tgnb.train.callback import GuardCallback, training_args
    from tgnb.train.metrics import MetricsCallback
    from tgnb.train.preemption import CheckpointGuard
    from tgnb.train.record import Recorder

    run_dir = root / f"{'tgnb' if tgnb else 'plain'}-{index}"
    cfg = config.load(None, [f"algorithm={algorithm}", f"max_steps={steps}"], run_dir=run_dir)
    kwargs = runner.training_kwargs(cfg, torch.cuda.is_available())
    timer = make_timer()
    guard = None
    if tgnb:
        recorder = Recorder(run_dir, cfg.name)
        guard = CheckpointGuard(cfg.checkpoint, run_dir, recorder)
        args = runner._args(cfg, training_args(kwargs, guard.ckpt_dir))
        callbacks = [timer, GuardCallback(guard), MetricsCallback(recorder)]
    else:
        kwargs.update(output_dir=str(run_dir / "out"), save_strategy="no")
        args = runner._args(cfg, kwargs)
        callbacks = [timer]
    trainer = runner.build_trainer(cfg, args, callbacks)
    if guard is not None:
        guard.attach(trainer)  # as the runner does: the saver (its process group and stager)
    log = open(root / "stdout.log", "a", encoding="utf-8")  # noqa: SIM115 - closed below
    try:
        with contextlib.redirect_stdout(log):
            trainer.train(resume_from_checkpoint=guard.resume_from() if guard else None)
            if guard is not None:
                guard.finish(trainer)
    finally:
        log.close()
        if guard is not None:
            guard.close()
    return timer.times[1:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithm", default="grpo", choices=["grpo", "dpo"])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    ns = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # as runner.run does for tiny on the CPU
    with tempfile.TemporaryDirectory(prefix="tgnb-overhead-") as tmp:
        root = Path(tmp)
        os.environ.setdefault("TGNB_HOME", str(root / "home"))
        plain: list[float] = []
        ours: list[float] = []
        one_side(ns.algorithm, 5, False, root, -1)  # warm-up: imports, tiny assets, caches
        for i in range(ns.rounds):
            order = [False, True] if i % 2 == 0 else [True, False]
            for tgnb in order:
                (ours if tgnb else plain).extend(one_side(ns.algorithm, ns.steps, tgnb, root, i))
        p_med, o_med = statistics.median(plain), statistics.median(ours)
        p_mean, o_mean = statistics.mean(plain), statistics.mean(ours)
    print(f"algorithm {ns.algorithm}, {ns.rounds} interleaved rounds of {ns.steps} steps per side")
    print(
        f"plain TRL step time: median {p_med * 1e3:.2f} ms, mean {p_mean * 1e3:.2f} ms ({len(plain)} steps)"
    )
    print(
        f"tgnb      step time: median {o_med * 1e3:.2f} ms, mean {o_mean * 1e3:.2f} ms ({len(ours)} steps)"
    )
    print(f"overhead ratio (median tgnb / median plain): {o_med / p_med:.3f}  (target <= 1.02)")
    print(f"overhead ratio (mean): {o_mean / p_mean:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
