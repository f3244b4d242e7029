"""``tgnb demo``: the main job, end to end on the local emulator, with no account.

It starts (or reuses) the emulator daemon with compressed platform time (the 300 s drain window
lasts 6 s at the default time scale 0.02), attaches to a demo cluster (created if missing),
raises the preemptible target to 16 GPUs, waits for the two preemptible nodes, launches a GRPO
(or DPO) run of the built-in tiny task on a preemptible node and preempts that node mid-run. As
it goes it prints the cluster's node events and the run's own events: the preemption notice, the
checkpoint saved inside the drain window, the node removed, the replacement added, the run
resumed. At the end: steps done against max_steps, steps lost, restarts, first and last reward.

Exit status 0 only if the run finished at max_steps with at most one step lost after a restart
whose checkpoint was saved inside the drain window.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tgnb.events import (
    CHECKPOINT_SAVED,
    NODE_ADDED,
    PREEMPTED,
    PREEMPTION_NOTIFIED,
    RUN_RESUMED,
    Event,
    from_record,
)

TARGET = 16


class Printer:
    """Prints events and progress lines with the seconds since the demo started."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        with self.lock:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def event(self, ev: Event) -> None:
        detail = ""
        data = dict(ev.data)
        if "step" in data:
            detail += f" step {data['step']}"
        for key in ("trigger", "signal", "exit_reason", "restart_count", "duration_s"):
            if key in data:
                detail += f" {key}={data[key]}"
        where = f" on {ev.node}" if ev.node else ""
        self(f"{ev.source:<7} {ev.reason}{where}{detail}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb demo",
        description="Launch a run on preemptible emulated nodes, preempt its node, watch it "
        "checkpoint inside the drain window and resume (local emulator, no account).",
    )
    p.add_argument("--algorithm", choices=("grpo", "dpo"), default="grpo")
    p.add_argument("--slurm", action="store_true", help="a SLURM-type cluster (drain, no signal)")
    p.add_argument("--max-steps", type=int, default=40)
    p.add_argument("--preempt-at", type=int, default=None, help="step at which to preempt")
    p.add_argument("--home", type=Path, default=None, help="tgnb home (default $TGNB_HOME)")
    p.add_argument("--time-scale", type=float, default=0.02, help="platform time compression")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds")
    p.add_argument("--stop", action="store_true", help="stop the emulator daemon at the end")
    return p


def _check(summary: dict[str, Any], window_ok: bool, out: Printer) -> list[str]:
    problems = []
    if summary["state"] != "succeeded":
        problems.append(f"the run ended {summary['state']}")
    if summary["steps"] != summary["max_steps"]:
        problems.append(f"{summary['steps']} steps done, not {summary['max_steps']}")
    if summary["steps_lost"] > 1:
        problems.append(f"{summary['steps_lost']} steps lost (at most 1 allowed)")
    if summary["restarts"] < 1:
        problems.append("the run was never restarted")
    if not window_ok:
        problems.append("no checkpoint saved inside the drain window")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from tgnb.cloud import EventFeed
    from tgnb.errors import TgnbError
    from tgnb.session import attach

    out = Printer()
    ctype = "SLURM" if args.slurm else "KUBERNETES"
    from tgnb import connection

    ours = not connection.running(args.home)  # --stop stops only an emulator started here
    try:
        session = attach(local=True, home=args.home, cluster_type=ctype, time_scale=args.time_scale)
    except TgnbError as exc:
        print(f"tgnb demo: {exc}", file=sys.stderr)
        return 1
    try:
        return _demo(session, args, out, EventFeed)
    except TgnbError as exc:
        print(f"tgnb demo: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.stop and ours:
            from tgnb.session import shutdown_local

            shutdown_local(session.home)
        elif args.stop:
            print("left the local emulator running: this command did not start it", flush=True)


def _demo(session: Any, args: argparse.Namespace, out: Printer, feed_cls: Any) -> int:
    from tgnb.events import utcnow

    start = utcnow()
    state = session.status()
    out(
        f"attached to {state.name} ({state.type}, {session.cloud.base_url}); run store {session.store.path}"
    )
    scale = _time_scale(session)
    if scale is not None and abs(scale - args.time_scale) > 1e-9:
        out(
            f"note: the running emulator compresses time by {scale:g}, not {args.time_scale:g} "
            "(stop it with 'tgnb emulator stop' to change that)"
        )
    feed = feed_cls(session.cluster.state, since=start)
    stop = threading.Event()

    def watch_cluster() -> None:
        while not stop.is_set():
            try:
                for ev in feed.poll():
                    if ev.source == "cluster":
                        out.event(ev)
            except Exception as exc:  # keep the demo going through a transient read error
                out(f"(cluster read failed: {exc})")
            stop.wait(0.5)

    watcher = threading.Thread(target=watch_cluster, name="tgnb-demo-events", daemon=True)
    watcher.start()
    try:
        out(f"raising the preemptible target to {TARGET} GPUs and waiting for two nodes")
        waited = session.scale(preemptible=TARGET, wait=True, timeout=min(300.0, args.timeout))
        out(str(waited))
        if not waited:
            return 1
        overrides: dict[str, Any] = {"max_steps": args.max_steps}
        overrides["checkpoint"] = {"drain_poll_seconds": 0.2}
        run = session.launch(
            args.algorithm, name=f"demo-{args.algorithm}-{int(time.time())}", **overrides
        )
        out(f"launched {run.name} on preemptible nodes; run directory {run.run_dir}")
        preempt_at = args.preempt_at or max(2, args.max_steps // 3)
        return _follow(session, run, preempt_at, args, out, feed)
    finally:
        stop.set()
        watcher.join(timeout=5)


def _follow(
    session: Any, run: Any, preempt_at: int, args: argparse.Namespace, out: Printer, feed: Any
) -> int:
    deadline = time.monotonic() + args.timeout
    preempted = False
    for rec in run.follow(records=True):
        if rec.get("kind") == "metrics":
            step = int(rec.get("step", 0))
            if step % 5 == 0 or step == args.max_steps:
                reward = rec.get("reward", rec.get("rewards/margins"))
                shown = f" reward {reward:.3f}" if isinstance(reward, (int, float)) else ""
                out(f"run     step {step}/{args.max_steps}{shown}")
            if not preempted and step >= preempt_at:
                preempted = True
                node = run.status.nodes[0]
                out(f"preempting {node} (the run's node) at step {step}")
                session.preempt(node)
        elif rec.get("kind") == "events" and (event := from_record(rec)) is not None:
            out.event(event)
        if time.monotonic() > deadline:
            out("timed out; stopping the run")
            run.stop()
            break
    status = run.wait(timeout=60)
    out(f"run {run.name} {status.state.value}: {status.detail}")
    # The removal and the replacement come at the end of the drain window; wait for them.
    evs: list[Event] = []
    for _ in range(120):
        evs = run.events()
        if any(e.reason == PREEMPTED for e in evs) and any(
            e.reason == NODE_ADDED and e.time > _first(evs, PREEMPTED) for e in evs
        ):
            break
        time.sleep(0.5)
    window_ok = checkpoint_in_window(evs)
    summary = run.summary()
    out(
        f"steps {summary['steps']}/{summary['max_steps']}, steps lost {summary['steps_lost']}, "
        f"restarts {summary['restarts']}, {summary['reward_key']} first "
        f"{_fmt(summary['reward_first'])} last {_fmt(summary['reward_last'])}"
    )
    out("timeline:")
    for ev in evs:
        if ev.reason in (PREEMPTION_NOTIFIED, CHECKPOINT_SAVED, PREEMPTED, NODE_ADDED, RUN_RESUMED):
            print(f"    {ev.time.strftime('%H:%M:%S.%f')[:-3]}  {ev.reason:<27} {ev.node or ''}")
    problems = _check(summary, window_ok, out)
    if problems:
        out("FAILED: " + "; ".join(problems))
        return 1
    out("OK: preempted, checkpointed inside the drain window, resumed and finished")
    return 0


def _time_scale(session: Any) -> float | None:
    return None if session.emulator is None else session.emulator.time_scale()


def _first(evs: list[Event], reason: str) -> Any:
    return min(e.time for e in evs if e.reason == reason)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}"


def checkpoint_in_window(evs: list[Event]) -> bool:
    """Whether a checkpoint was saved between a preemption notice and that node's removal."""
    for notice in (e for e in evs if e.reason == PREEMPTION_NOTIFIED):
        removed = [e.time for e in evs if e.reason == PREEMPTED and e.node == notice.node]
        if not removed:
            continue
        end = min(removed)
        for ck in (e for e in evs if e.reason == CHECKPOINT_SAVED and e.node == notice.node):
            if notice.time <= ck.time <= end:
                return True
    return False


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
