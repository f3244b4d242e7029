"""Checkpoint-restart against replica groups (issue 50), the same program and the same preemption
schedule, side by side in one run on the emulator:

    python bench/fault_tolerance.py [--steps 5000] [--every 1500] [--step-s 0.1] [--rounds 1]
                                    [--heartbeat-ms 2000] [--mode MODE] [--keep DIR]

- **checkpoint-restart**: `tests/backends/ft_workdir/train_ckpt.py`, plain DDP over gloo on two
  nodes under torchrun, `tgnb.train.Checkpointer` (a checkpoint on the notice, and every
  ``--every`` / 2 steps); a preemption stops both nodes, the run restarts and resumes.
- **replica groups**: `tests/backends/ft_workdir/train_ft.py`, the same model, data and step time
  on TorchFT's Manager, launched with ``fault_tolerance="torchft"``: two groups under a lighthouse.

The schedule, by the program's step (by default an event every 1,500 steps, about 3.5 minutes
here: "one preemption every few minutes", the goodput target's condition): a preemption notice
of one node at step ``--every`` and ``2 * --every``, and at ``3 * --every`` one node's processes
SIGKILLed with no notice. Figures (medians over ``--rounds``):

- steps/min: the run's last step over the minutes from its launch to that step;
- step s: the uninterrupted step time, the mean interval between one process's consecutive steps
  with both groups (nodes) in and no engine event between them (the median beside it, in the
  round's line); the launch to the first step is in the round's line too (``first_step_s``);
- survivors' stall per preemption: the longest gap between a continuing process's step lines
  around the event, less the uninterrupted step time (for checkpoint-restart nothing continues:
  the gap from the last step before the event to the first after it);
- replacement → lockstep: from a replacement group's start to the first quorum it is in, at the
  others' step (`GroupHealed`'s ``took_s``); for checkpoint-restart, from the restart's placement
  to its first step;
- goodput: samples trained once (each step once, times the groups in it) ÷ what the groups held
  could have trained: the uninterrupted rate per group × the group-seconds the engine held
  (`JobPlaced` → `JobReleased`), process starts included.

Targets (issue 50): a stall on a notice ≤ one step time; goodput ≥ 0.95; lockstep ≤ 2 s. The load
average is printed with each round: this machine's other work slows process starts.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from tests.backends.local.conftest import make_session, stop_everything
from tgnb.emulator.testing import running_emulator
from tgnb.events import GROUP_HEALED, JOB_PLACED, JOB_RELEASED, QUORUM_CHANGED, parse_time
from tgnb.runs import ft
from tgnb.runs.node import NODE_ENV, RUN_ENV
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore
from tgnb.session import Session

WORKDIR = Path(__file__).resolve().parents[1] / "tests" / "backends" / "ft_workdir"
MODES = {"checkpoint-restart": "train_ckpt.py", "replica groups": "train_ft.py"}


def lines(run: Run, key: str = "step") -> list[dict[str, Any]]:
    """The program's JSON lines holding `key` (``step``: one per step; ``started``: a start)."""
    assert run.run_dir is not None
    path = run.run_dir / "train.log"
    out = []
    text = path.read_text(errors="replace") if path.exists() else ""
    for line in text.replace("}{", "}\n{").splitlines():  # two groups' lines may run into one
        if line.startswith("{") and f'"{key}"' in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def tgnb_events(run: Run) -> list[dict[str, Any]]:
    assert run.run_dir is not None
    path = run.run_dir / "events.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [e for e in rows if e.get("source") == "tgnb"]


def kill_node(run: Run, node: str) -> int:
    """SIGKILL every process of `run` on `node` (no notice: a crash, a lost machine)."""
    want = {f"{NODE_ENV}={node}".encode(), f"{RUN_ENV}={run.name}".encode()}
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if want <= set((entry / "environ").read_bytes().split(b"\0")):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def nodes_of(run: Run, mode: str) -> list[str]:
    if mode == "replica groups":  # the node of each live group, by group
        live: dict[int, str] = {}
        for e in tgnb_events(run):
            g = e.get("data", {}).get("group")
            if e["reason"] == JOB_PLACED:
                live[g] = e["node"]
            elif e["reason"] == JOB_RELEASED:
                live.pop(g, None)
        return [live[g] for g in sorted(live)]
    return list(run.status.nodes)


def one(session: Session, mode: str, args: argparse.Namespace, tag: str) -> dict[str, Any]:
    env = {"FT_STEPS": str(args.steps), "FT_STEP_S": str(args.step_s),
           ft.HEARTBEAT_TIMEOUT_ENV: str(args.heartbeat_ms)}  # fmt: skip
    extra: dict[str, Any] = {"fault_tolerance": "torchft"} if mode == "replica groups" else {}
    t0 = time.time()
    run = session.launch(MODES[mode], workdir=WORKDIR, name=f"{tag}", nodes=2, env=env,
                         recovery=RecoveryPolicy(max_restarts=5, backoff_s=1.0),
                         checkpoint={"every_steps": max(1, args.every // 2)}, **extra)  # fmt: skip
    hits: list[tuple[str, float]] = []
    schedule = [(args.every, "notice"), (2 * args.every, "notice"), (3 * args.every, "kill")]
    for at, what in schedule:
        while not run.status.state.finished:
            if max((x["step"] for x in lines(run)), default=0) >= at:
                break
            time.sleep(0.1)
        nodes = nodes_of(run, mode)
        if run.status.state.finished or not nodes:
            break
        victim = nodes[-1]
        hits.append((what, time.time()))
        if what == "notice":
            session.preempt(victim)
        else:
            kill_node(run, victim)
    final = run.wait(timeout=900)
    rows = lines(run)
    evs = tgnb_events(run)
    last = max((x["step"] for x in rows), default=0)
    t_end = max((x["t"] for x in rows if x["step"] == last), default=time.time())
    # the uninterrupted step time: the mean interval of one process's consecutive steps with
    # both groups in and no engine event or process start between them (a loaded machine's slow
    # steps included: a median would leave them out and count them as lost to preemptions)
    by: dict[int, list[dict[str, Any]]] = {}
    for x in rows:
        by.setdefault(x["group"], []).append(x)
    marks = sorted([parse_time(e["time"]).timestamp() for e in evs]
                   + [x["started"] for x in lines(run, "started")])  # fmt: skip

    def calm(a: float, b: float) -> bool:  # nothing happened in (a, b]
        i = bisect.bisect_right(marks, a)
        return i == len(marks) or marks[i] > b

    gaps = [
        b["t"] - a["t"]
        for xs in by.values()
        for a, b in itertools.pairwise(xs)
        if b["step"] == a["step"] + 1 and a["participants"] == b["participants"] == 2
        and calm(a["t"], b["t"])
    ]  # fmt: skip
    step_s = statistics.fmean(gaps) if gaps else float("nan")
    first_step = min((x["t"] for x in rows), default=t0) - t0  # the launch to the first step
    stalls: list[float] = []
    heal: list[float] = []
    if mode == "replica groups":  # the survivors' wait: the quorum after a group went, less a step
        shrank = [e["data"] for e in evs if e["reason"] == QUORUM_CHANGED]
        for a, b in itertools.pairwise(shrank):
            if len(b["groups"]) < len(a["groups"]):
                stalls.append(round(max(0.0, b["waited_s"] - step_s), 2))
    for _what, te in hits if mode == "checkpoint-restart" else ():  # every process stops
        before = [x["t"] for x in rows if x["t"] <= te]
        after = [x["t"] for x in rows if x["t"] > te]
        if before and after:  # the longest gap in the 2 minutes after it: stop, restart, resume
            ts = [before[-1], *(t for t in after if t < te + 120)]
            gap = max((b - a for a, b in itertools.pairwise(ts)), default=0.0)
            stalls.append(round(max(0.0, gap - step_s), 2))
    if mode == "replica groups":
        lockstep = [e["data"]["took_s"] for e in evs if e["reason"] == GROUP_HEALED
                    and parse_time(e["time"]).timestamp() > t0 + 1 and e["data"].get("took_s")]  # fmt: skip
        lockstep = lockstep[1:] if len(lockstep) > len(hits) else lockstep  # not the first start
        # the same from the program's start (after its imports) to the quorum it healed in
        started = lines(run, "started")
        for e in evs:
            if e["reason"] == GROUP_HEALED and parse_time(e["time"]).timestamp() > t0 + 1:
                at = parse_time(e["time"]).timestamp()
                mine = [x["started"] for x in started
                        if x["group"] == e["data"]["group"] and x["started"] < at]  # fmt: skip
                if mine:
                    heal.append(round(at - max(mine), 2))
        heal = heal[1:] if len(heal) > len(hits) else heal
        per_step: dict[int, int] = {}
        for x in rows:
            per_step[x["step"]] = max(per_step.get(x["step"], 0), x["participants"])
        samples = sum(per_step.values())
    else:
        placed = [parse_time(e["time"]).timestamp() for e in evs if e["reason"] == JOB_PLACED]
        restarts = sorted(set(round(p, 0) for p in placed))[1:]
        lockstep = []
        for p in restarts:
            first = [x["t"] for x in rows if x["t"] > p]
            if first:
                lockstep.append(round(min(first) - p, 2))
        samples = 2 * last
    held = 0.0
    open_: dict[str, float] = {}
    for e in evs:
        t = parse_time(e["time"]).timestamp()
        if e["reason"] == JOB_PLACED:
            open_[e["node"]] = t
        elif e["reason"] == JOB_RELEASED and e["node"] in open_:
            held += t - open_.pop(e["node"])
    held += sum(t_end - t for t in open_.values())
    goodput = samples * step_s / held if held else float("nan")
    return {
        "state": final.state.value,
        "steps": last,
        "steps_per_min": round(last / ((t_end - t0) / 60), 1),
        "step_s": round(step_s, 3),
        "median_step_s": round(statistics.median(gaps), 3) if gaps else None,
        "first_step_s": round(first_step, 2),
        "stalls_s": stalls,
        "lockstep_s": [round(x, 2) for x in lockstep],
        "from_program_s": heal,
        "goodput": round(goodput, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--every", type=int, default=1500)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--heartbeat-ms", type=int, default=ft.LighthouseOptions().heartbeat_timeout_ms)
    p.add_argument("--mode", choices=list(MODES), help="run this mode alone")
    p.add_argument("--keep", help="a directory to keep the runs in (default: a temporary one)")
    args = p.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES if args.mode in (None, m)}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(args.keep or tmp)
        with running_emulator(home, time_scale=0.02):
            try:
                session = make_session(home, target=32)
                for r in range(args.rounds):
                    for mode in results:
                        load = os.getloadavg()[0]
                        res = one(session, mode, args, f"{mode.split()[0]}-{r}")
                        res["load"] = round(load, 2)
                        results[mode].append(res)
                        print(f"round {r} {mode}: {json.dumps(res)}", flush=True)
            finally:
                stop_everything(RunStore(home))
    print(f"\n{args.steps} steps of {args.step_s} s, notices at {args.every} and {2 * args.every}, "
          f"a kill at {3 * args.every}; heartbeat timeout {args.heartbeat_ms} ms; "
          f"medians of {args.rounds} round(s)")  # fmt: skip
    print(f"{'':20}{'steps/min':>10}{'step s':>8}{'stall s':>10}{'lockstep s':>12}"
          f"{'(program)':>10}{'goodput':>9}")  # fmt: skip
    for mode, rs in results.items():
        med = statistics.median
        stall = med([s for r in rs for s in r["stalls_s"]] or [float("nan")])
        lock = med([s for r in rs for s in r["lockstep_s"]] or [float("nan")])
        prog = med([s for r in rs for s in r["from_program_s"]] or [float("nan")])
        print(f"{mode:20}{med(r['steps_per_min'] for r in rs):>10.1f}"
              f"{med(r['step_s'] for r in rs):>8.3f}{stall:>10.2f}{lock:>12.2f}{prog:>10.2f}"
              f"{med(r['goodput'] for r in rs):>9.3f}")  # fmt: skip
    print(f"load average now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
