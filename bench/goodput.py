"""Goodput under preemption on the local emulator: tgnb against a periodic-checkpoint baseline.

    python bench/goodput.py [--algorithm dpo|grpo] [--kubernetes] [--per 20] [--intervals 3]

Goodput is useful optimizer steps per wall-clock second, from launch to the run's end. For each
mode the ratio printed is goodput with a preemption every X seconds divided by goodput of the same
run with no preemption (measured in this same invocation, side by side):

- tgnb: the runtime checkpoints when the preemption notice comes (the drain notice on a SLURM-type
  cluster, SIGTERM on a KUBERNETES-type one) and resumes on the next node;
- baseline: ignores the notice and only checkpoints every N steps, as the seed's Slurm example does
  (on a SLURM-type cluster it is killed at the end of the drain window and requeued; on a
  KUBERNETES-type one SIGTERM ends it at once). N defaults to the Young/Daly optimum
  sqrt(2*C*X) / step time, the baseline's best case.

The two runs of each comparison (preempted and not) run at the same time on separate nodes, so
they share the machine's load alike. X is `--per` times the measured cost of one checkpoint-and-restart (C+R: save, exit, start on the
next node, load), calibrated first with one preempted short run; C alone (the save) is printed too.
The emulator's platform time is compressed (`--time-scale`, the 300 s drain window lasts 6 s at
0.02). Target for tgnb: a ratio of at least 0.9 at one preemption per 20 checkpoint costs.

``--gpu-regime`` instead simulates the GPU regime no CPU machine can run, driven by the same policy
code (`tgnb.train.checkpoint.young_daly_seconds`, the interval the runtime's ``auto`` takes): a
checkpoint write C (default 90 s, a 10B model), a training stall of an asynchronous save S (default
C x 6.3/148.8, PyTorch's async DCP figure for a 7B model), a 300 s drain window, steps of 10 s, one
preemption an hour (exponential, seeded), a restart of 180 s, every preemption with a notice
(``--unannounced`` gives the share without one). tgnb: asynchronous periodic saves every
sqrt((2 S + λp C²) / λf), λp the preemptions and λf the failures without a notice its ``auto``
insures against (``--failures-per-hour``, by default the runtime's own default), stalling S each;
at a notice the step in progress ends (the save in flight goes on meanwhile), the save in flight
finishes, a synchronous save (C) is made and the run exits; it restarts R after its exit
(`--restart-after removal`: after the node is removed at the end of the window); with no notice the
work since the last complete save is lost. Baseline: synchronous saves every sqrt(2 C M) (it ignores
notices, so every interruption loses its work), killed at the end of the window (at once with no
notice), restarted R later. Printed: goodput of each, tgnb / baseline (target >= 1.2) and tgnb / the
ideal bound 1 - (C + R) / M (target >= 0.95); what a runtime that stops at the notice would reach
with periodic saves that cost nothing and none ever in flight; and tgnb / baseline when a share of
the interruptions comes with no notice, for three assumptions of ``auto``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tgnb.backends.base import JobState
from tgnb.emulator.testing import running_emulator
from tgnb.runs.policy import CheckpointPolicy
from tgnb.runs.run import Run
from tgnb.session import Session, attach


def _times(run: Run, reason: str) -> list[float]:
    return [e.time.timestamp() for e in run.run_events() if e.reason == reason]


def _result(label: str, run: Run, wall: float, preemptions: int) -> dict[str, Any]:
    st = run.status
    if st.state != JobState.SUCCEEDED:
        raise SystemExit(f"{label}: run ended {st.state.value}: {st.detail}")
    summary = run.summary()
    saves = [e for e in run.run_events() if e.reason == "CheckpointSaved"]
    durations = [float(e.data.get("duration_s", 0.0)) for e in saves]
    return {
        "label": label,
        "run": run,
        "wall": wall,
        "steps": summary["steps"],
        "lost": summary["steps_lost"],
        "restarts": summary["restarts"],
        "preemptions": preemptions,
        "saves": len(saves),
        "save_s": statistics.median(durations) if durations else 0.0,
    }


def run_side_by_side(
    session: Session,
    labels: tuple[str, ...],
    algorithm: str,
    max_steps: int,
    checkpoint: dict[str, Any],
    interval: float | None = None,
    preempt_at_step: int | None = None,
    timeout: float = 3600.0,
) -> list[dict[str, Any]]:
    """Launch the same run once per label, at the same time (so they share the machine's load
    alike); the first one's node is preempted every `interval` s of training (or once at a step),
    the others run undisturbed. Wall time is from launch to each run's own end."""
    stamp = int(time.time() * 1000) % 10**8
    runs = [
        session.launch(
            algorithm, name=f"{label}-{stamp}", max_steps=max_steps, checkpoint=checkpoint
        )
        for label in labels
    ]
    t0 = time.monotonic()
    walls: dict[int, float] = {}
    first_step: float | None = None
    last_preempt: float | None = None
    preemptions = 0
    target = runs[0]
    while len(walls) < len(runs):
        now = time.monotonic()
        for i, run in enumerate(runs):
            if i not in walls and run.status.state.finished:
                walls[i] = now - t0
        if now - t0 > timeout:
            for run in runs:
                run.stop()
            raise SystemExit(f"{labels}: no end after {timeout:.0f} s")
        if 0 not in walls and (interval or preempt_at_step):
            steps = len(target.records("metrics")) if first_step is None or preempt_at_step else 0
            if first_step is None and steps:
                first_step = last_preempt = now
            due = bool(interval and last_preempt is not None and now - last_preempt >= interval)
            due = due or bool(preempt_at_step and not preemptions and steps >= preempt_at_step)
            st = target.status
            if due and st.state == JobState.RUNNING and st.nodes:
                session.preempt(st.nodes[0])
                preemptions += 1
                last_preempt = now
        time.sleep(0.1)
    return [
        _result(label, run, walls[i], preemptions if i == 0 else 0)
        for i, (label, run) in enumerate(zip(labels, runs, strict=True))
    ]


def calibrate(run: Run) -> tuple[float, float]:
    """(median step time, checkpoint-and-restart cost) from a run preempted once."""
    rows = run.records("metrics")
    times = [float(r["time"]) for r in rows]
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    step = statistics.median(gaps[: max(1, len(gaps) - 1)])  # without the restart gap
    notices = _times(run, "SignalReceived") + _times(run, "DrainNoticeReceived")
    if not notices or not _times(run, "RunResumed"):
        raise SystemExit("calibrate: the run ended before its preemption landed; rerun")
    notice, resumed = min(notices), min(_times(run, "RunResumed"))
    after = min(t for t in times if t > resumed)
    # From the notice to the first step done after the resume, less that step's own time.
    return step, max(0.0, after - notice - step)


def simulate(
    args: argparse.Namespace,
    failures_per_hour: float | None = None,
    unannounced: float | None = None,
) -> dict[str, float]:
    """Goodput of tgnb and of the periodic baseline in the GPU regime (see the module docstring).
    `failures_per_hour` is what tgnb's ``auto`` assumes (default ``--failures-per-hour``);
    `unannounced` the share of the interruptions that do come with no notice (``--unannounced``)."""
    import random

    from tgnb.train.checkpoint import young_daly_seconds

    c, w, step, r = args.ckpt_s, args.window_s, args.step_s, args.restart_s
    stall = args.stall_s if args.stall_s is not None else c * 6.3 / 148.8
    assumed = args.failures_per_hour if failures_per_hour is None else failures_per_hour
    hard_share = args.unannounced if unannounced is None else unannounced
    mtbf = 3600.0 / args.per_hour
    # tgnb: the interval its `auto` policy takes (C the measured stall, the write waited for at
    # a notice, failures without a notice insured against); the baseline ignores notices, so
    # every interruption loses its work: plain Young/Daly on the whole write
    tau_t = young_daly_seconds(stall, assumed, c, args.per_hour)
    tau_b = young_daly_seconds(c, args.per_hour)
    rng, world = random.Random(args.seed), random.Random(args.seed + 1)
    useful = {"tgnb": 0.0, "baseline": 0.0, "bound": 0.0}
    wall = {"tgnb": 0.0, "baseline": 0.0, "bound": 0.0}
    for _ in range(args.cycles):
        life = rng.expovariate(1.0 / mtbf)  # from the (re)start to the interruption
        hard = world.random() < hard_share  # no notice: the node is gone at once
        # tgnb: progress between async saves, each stalling training
        saves = math.floor(life / (tau_t + stall))
        done = life - saves * stall
        since = life - saves * (tau_t + stall)  # time since the last periodic save began
        # the most any stop-at-the-notice runtime can reach: periodic saves free, none in flight
        finish_step = step - (done % step)
        last = finish_step + c
        useful["bound"] += life if hard else life + finish_step
        wall["bound"] += life + r + (0.0 if hard else _after(args, last))
        if hard:  # the work since the last complete periodic save is lost
            complete = saves if since >= c else saves - 1
            useful["tgnb"] += max(0, complete) * tau_t
            wall["tgnb"] += life + r
        else:  # the step ends (the save in flight goes on meanwhile), it finishes, a sync save
            in_flight = max(0.0, c - since - finish_step) if saves else 0.0
            useful["tgnb"] += done + finish_step
            wall["tgnb"] += life + _after(args, finish_step + in_flight + c) + r
        # baseline: synchronous saves every tau_b of progress, killed at the end of the window
        alive = life + (0.0 if hard else w)
        useful["baseline"] += math.floor(alive / (tau_b + c)) * tau_b
        wall["baseline"] += alive + r
    g = {k: useful[k] / wall[k] for k in useful}
    ideal = 1.0 - (c + r) / mtbf
    return {
        "tgnb": g["tgnb"],
        "baseline": g["baseline"],
        "ideal": ideal,
        "tgnb_over_baseline": g["tgnb"] / g["baseline"],
        "tgnb_over_ideal": g["tgnb"] / ideal,
        "bound_over_baseline": g["bound"] / g["baseline"],
        "interval_tgnb_s": tau_t,
        "interval_baseline_s": tau_b,
        "stall_s": stall,
    }


def _after(args: argparse.Namespace, stop: float) -> float:
    """From the notice to the restart's start: the run's exit, or the node's removal."""
    return max(stop, args.window_s) if args.restart_after == "removal" else stop


def _print_regime(args: argparse.Namespace) -> None:
    res = simulate(args)
    print(
        f"GPU regime (C {args.ckpt_s:.0f} s, stall {res['stall_s']:.1f} s, window "
        f"{args.window_s:.0f} s, step {args.step_s:.0f} s, {args.per_hour:g} preemption(s)/h "
        f"with a notice, {args.unannounced:.0%} without, R {args.restart_s:.0f} s, restart after "
        f"{args.restart_after}; tgnb auto assumes {args.failures_per_hour:g} failure(s)/h "
        f"without a notice): goodput tgnb {res['tgnb']:.3f} (every "
        f"{res['interval_tgnb_s']:.0f} s), baseline {res['baseline']:.3f} (every "
        f"{res['interval_baseline_s']:.0f} s); tgnb/baseline {res['tgnb_over_baseline']:.3f} "
        f"(target >= 1.2), tgnb/ideal {res['tgnb_over_ideal']:.3f} (ideal {res['ideal']:.3f}; "
        f"target >= 0.95); a runtime that stops at the notice with free periodic saves: "
        f"{res['bound_over_baseline']:.3f} x the baseline"
    )
    shares = (0.0, 0.1, 0.5, 1.0)
    print("tgnb/baseline when a share of the interruptions comes with no notice (columns), by")
    print("the failures/h tgnb's auto assumes (rows; 'preempt.' = as many as preemptions):")
    print(f"{'assumed':>10}" + "".join(f"{f'{x:.0%} none':>11}" for x in shares))
    for assumed in (args.per_hour, 0.1, 0.01):
        label = "preempt." if assumed == args.per_hour else f"{assumed:g}/h"
        cells = [simulate(args, assumed, x)["tgnb_over_baseline"] for x in shares]
        print(f"{label:>10}" + "".join(f"{v:11.3f}" for v in cells))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-regime", action="store_true", help="simulate the GPU regime instead")
    p.add_argument("--ckpt-s", type=float, default=90.0, help="C: one checkpoint's write (s)")
    p.add_argument("--stall-s", type=float, default=None, help="S: an async save's stall (s)")
    p.add_argument("--window-s", type=float, default=300.0, help="drain window (s)")
    p.add_argument("--step-s", type=float, default=10.0, help="one optimizer step (s)")
    p.add_argument("--per-hour", type=float, default=1.0, help="interruptions per hour")
    p.add_argument(
        "--unannounced",
        type=float,
        default=0.0,
        help="their share with no notice (0: all have one)",
    )
    p.add_argument(
        "--failures-per-hour",
        type=float,
        default=CheckpointPolicy.failures_per_hour,
        help="failures without a notice tgnb's auto insures against (default: the runtime's)",
    )
    p.add_argument("--restart-s", type=float, default=180.0, help="R: restart to training (s)")
    p.add_argument("--restart-after", choices=("exit", "removal"), default="exit")
    p.add_argument("--cycles", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algorithm", choices=("dpo", "grpo"), default="dpo")
    p.add_argument("--kubernetes", action="store_true", help="KUBERNETES-type cluster (SIGTERM)")
    p.add_argument("--per", type=float, default=20.0, help="preempt every PER checkpoint costs")
    p.add_argument("--interval", type=float, default=None, help="preemption interval X (s)")
    p.add_argument("--intervals", type=float, default=5.0, help="run length, in intervals X")
    p.add_argument("--every-steps", type=int, default=None, help="baseline checkpoint period")
    p.add_argument("--time-scale", type=float, default=0.02)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.gpu_regime:
        _print_regime(args)
        return 0
    ctype = "KUBERNETES" if args.kubernetes else "SLURM"
    with tempfile.TemporaryDirectory(prefix="tgnb-goodput-") as tmp:
        home = Path(tmp)
        with running_emulator(home, time_scale=args.time_scale):
            session = attach(local=True, home=home, cluster_type=ctype)
            # three nodes: one per run of a pair, and a free one for the preempted run's restart
            if not session.scale(preemptible=24, wait=True, timeout=120, poll=0.2):
                raise SystemExit("the emulator did not provide three preemptible nodes")
            try:
                return _bench(session, args, ctype)
            finally:
                for run in session.runs():
                    run.stop()
                for run in session.runs():
                    run.wait(timeout=60)


def _bench(session: Session, args: argparse.Namespace, ctype: str) -> int:
    algo = args.algorithm
    fast = {"drain_poll_seconds": 0.2}
    # long enough that the notice (sent at step 5, seen at the next poll) lands mid-run: the tiny
    # model's steps take tens of milliseconds
    (cal,) = run_side_by_side(session, ("calibrate",), algo, 100, fast, preempt_at_step=5)
    step, cycle = calibrate(cal["run"])
    save = cal["save_s"]
    interval = args.interval or args.per * cycle
    # Two runs share the machine at a time, so each step takes about twice as long.
    max_steps = max(20, math.ceil(args.intervals * interval / (2 * step)))
    every = args.every_steps or max(1, round(math.sqrt(2 * save * interval) / step))
    print(
        f"cluster type {ctype}, {algo}, step {step:.3f} s, checkpoint save C {save:.3f} s, "
        f"checkpoint-and-restart C+R {cycle:.2f} s"
    )
    print(
        f"preemption every X = {interval:.1f} s ({interval / cycle:.1f} x (C+R), "
        f"{interval / max(save, 1e-9):.0f} x C); {max_steps} steps per run; baseline "
        f"checkpoints every {every} steps"
    )
    baseline = {"every_steps": every, "on_signal": False, "watch_drain": False}
    tgnb_runs = run_side_by_side(session, ("tgnb", "reference"), algo, max_steps, fast, interval)
    base_runs = run_side_by_side(
        session, ("baseline", "baseline-ref"), algo, max_steps, baseline, interval
    )
    results = tgnb_runs + base_runs
    print(
        f"{'run':<13}{'wall s':>8}{'steps':>7}{'preempt':>8}{'restarts':>9}{'lost':>6}{'saves':>6}"
    )
    for r in results:
        print(
            f"{r['label']:<13}{r['wall']:8.1f}{r['steps']:7d}{r['preemptions']:8d}"
            f"{r['restarts']:9d}{r['lost']:6d}{r['saves']:6d}"
        )
    tg = tgnb_runs[1]["wall"] / tgnb_runs[0]["wall"]
    base = base_runs[1]["wall"] / base_runs[0]["wall"]
    for name, (pre, ref) in (("tgnb", tgnb_runs), ("baseline", base_runs)):
        if pre["preemptions"]:
            cost = (pre["wall"] - ref["wall"]) / pre["preemptions"]
            print(f"{name}: {cost:.1f} s of wall time lost per preemption")
    print(
        f"goodput ratio tgnb     (preempted / not preempted, side by side): {tg:.3f}"
        "  (target >= 0.9)"
    )
    print(f"goodput ratio baseline (preempted / not preempted, side by side): {base:.3f}")
    return 0 if tg >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
