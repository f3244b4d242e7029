"""``python bench/recovery.py --engine emulator``: the recovery policies as real runs on the emulator.

One seeded capacity trace (`tgnb.emulator.trace.generate`, drawn once here) is given to a real
emulator daemon (`AdminClient.set_capacity_trace`, for one cluster) at the launch of each policy's
run, so every policy meets the same withdrawals at the same time after its launch. Each run is a
real local-engine run (supervisor, placement by `tgnb.runs.recovery.decide`, preemption notices,
requeues) of the local engine tests' stand-in trainer (tests/backends/local/standin_train.py: a step counter
that saves on SIGTERM or the drain notice and exits 75), on a fresh cluster of its own with 16
preemptible and 16 standard GPUs (two nodes of each), the run asking for two nodes. The policies
run one after the other, each with the emulator's time compressed by ``--scale``; all figures are
platform time (real seconds / scale).

- ``plain --requeue``: the seed's script, said with the existing settings: wait for the full
  preemptible nodes (`RecoveryPolicy()`), checkpoint ``{every_steps: N, on_signal: false,
  watch_drain: false}``: periodic saves only, nothing saved on the notice (the SIGTERM kills it).
- ``wait``/``shrink``/``standard``: `RecoveryPolicy(when_short=...)` (``wait_s`` 10 platform min;
  shrink with ``min_nodes=1``), and a stand-in whose steps take longer on fewer nodes (the global
  batch kept). ``deadline``: wait plus a deadline of 1.5x the work at full size, plus the
  `Facts.restart_s` the local engine counts per restart (60 real seconds: `placement_facts` leaves
  the default, which the time scale does not compress; without it the slack is gone at launch).
  ``all-standard``: ``preemptible=False``.
- Time to finish: from the run's creation to its SUCCEEDED status (the run store's history).
  GPU cost: each attempt's nodes (``JobPlaced`` events) from its placement to its end (the next
  ``RunRequeued``, or the end of the run), priced by the node's class as the emulator lists it,
  preemptible at ``--discount`` of the standard price; in standard GPU-hours.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tgnb.emulator.testing import running_emulator
from tgnb.emulator.trace import generate
from tgnb.events import JOB_PLACED, RUN_REQUEUED
from tgnb.runs.recovery import Facts, RecoveryPolicy
from tgnb.runs.spec import JobState
from tgnb.session import Session, attach, shutdown_local

STANDIN_DIR = Path(__file__).resolve().parent.parent / "tests" / "backends" / "local"
NODES, GPUS = 2, 8


@dataclasses.dataclass
class Measured:
    """One real run: platform hours to finish, standard-GPU-hours of cost, the deadline."""

    hours: float
    cost: float
    restarts: int
    deadline_met: bool = True
    deadline_h: float | None = None  # after the launch, platform hours
    classes: str = ""


def trace_segments(a: Any, work_s: float) -> list[dict[str, Any]]:
    """The one seeded trace: 8 of 16 preemptible GPUs withdrawn at random (platform seconds),
    drawn for 20 times the work (`work_s`, platform seconds)."""
    doc = {"seed": a.seed, "capacity_gpus": NODES * GPUS, "withdrawn_gpus": GPUS,
           "mean_between_s": 60 * a.between_min, "mean_outage_s": 60 * a.outage_min,
           "duration_s": 20 * work_s}  # fmt: skip
    return [{"at_s": s.at_s, "gpus": s.gpus} for s in generate(doc)]


def _cluster(home: Path, name: str) -> Session:
    """A fresh cluster of two standard nodes, its preemptible target at two nodes, all up."""
    boot = attach(local=True, home=home)
    boot.cloud.create(name, num_gpus=NODES * GPUS, preemptible=NODES * GPUS)
    session = attach(name, local=True, home=home)
    assert session.scale(preemptible=NODES * GPUS, wait=True, timeout=120, poll=0.2)
    return session


def measure(emu: Any, session: Session, run: Any, scale: float, discount: float) -> Measured:
    """Time to finish and cost from what the run store, the run's events and the emulator say."""
    st = run.wait(timeout=900, progress=False)
    if st.state != JobState.SUCCEEDED:
        raise RuntimeError(f"run {run.name} ended {st.state.value}: {st.detail}")
    done = max(c.time for c in run.history() if c.state == JobState.SUCCEEDED)
    kinds = {n["name"]: n["kind"] for n in emu.nodes(session.cluster.id)}
    placed: dict[int, tuple[float, list[str]]] = {}
    ended: dict[int, float] = {}
    for e in run.run_events():
        r = int(e.data.get("restart_count", 0))
        if e.reason == JOB_PLACED and e.node:
            t0, names = placed.get(r, (e.time.timestamp(), []))
            placed[r] = (t0, [*names, e.node])
        elif e.reason == RUN_REQUEUED:
            ended[r - 1] = e.time.timestamp()
    cost, classes = 0.0, []
    for r, (t0, names) in sorted(placed.items()):
        for name in names:
            std = kinds.get(name) != "preemptible"
            classes.append("S" if std else "P")
            cost += GPUS * (ended.get(r, done) - t0) / scale / 3600 * (1.0 if std else discount)
        classes.append(" ")
    deadline = run.record.spec.policy.deadline
    return Measured(
        hours=(done - run.record.created_at) / scale / 3600,
        cost=cost,
        restarts=len(placed) - 1,
        deadline_met=deadline is None or done <= deadline,
        deadline_h=None if deadline is None else (deadline - run.record.created_at) / scale / 3600,
        classes="".join(classes).strip(),
    )


def launch(session: Session, name: str, a: Any, work_s: float) -> Any:
    """One policy's run (`work_s`: real seconds of work at full size)."""
    env = {"STANDIN_STEP_SECONDS": str(a.step_s), "STANDIN_FULL_NODES": str(NODES)}
    wait_s = 600 * a.scale
    kw: dict[str, Any] = {"nodes": NODES, "max_steps": a.steps, "env": env, "name": f"b-{name}"}
    if name == "plain --requeue":
        every = max(1, round(a.plain_every_min * 60 * a.scale / a.step_s))
        kw["name"] = "b-plain"
        kw["checkpoint"] = {"every_steps": every, "on_signal": False, "watch_drain": False}
        kw["recovery"] = RecoveryPolicy()
    elif name == "shrink":
        kw.update(min_nodes=1, recovery=RecoveryPolicy(when_short="shrink", wait_s=wait_s))
    elif name == "standard":
        kw["recovery"] = RecoveryPolicy(when_short="standard", wait_s=wait_s)
    elif name == "deadline":
        restart_s = Facts(nodes=NODES).restart_s  # what the local engine counts per restart
        kw["recovery"] = RecoveryPolicy(deadline=time.time() + 1.5 * work_s + restart_s)
    elif name == "all-standard":
        kw["preemptible"] = False
    else:
        kw["recovery"] = RecoveryPolicy()
    return session.launch("grpo", **kw)


def run_all(a: Any, names: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, Measured]]:
    """Every policy's run under the one trace; the trace and the figures."""
    work_s = a.steps * a.step_s
    segments = trace_segments(a, work_s / a.scale)
    os.environ["TGNB_TRAIN_MODULE"] = "standin_train"
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(STANDIN_DIR) + (os.pathsep + path if path else "")
    out: dict[str, Measured] = {}
    with tempfile.TemporaryDirectory(prefix="tgnb-bench-recovery-") as tmp:
        home = Path(tmp)
        os.environ["TGNB_HOME"] = str(home)  # the stand-in reads its world size from the store
        with running_emulator(home, time_scale=a.scale) as emu:
            try:
                for name in names:
                    session = _cluster(home, f"bench-{name.split()[0]}")
                    emu.set_capacity_trace(segments, cluster_id=session.cluster.id)
                    run = launch(session, name, a, work_s)
                    out[name] = measure(emu, session, run, a.scale, a.discount)
                    emu.clear_capacity_trace()
                    print(f"  {name:16} done: {out[name].hours:.2f} h, placements "
                          f"{out[name].classes}", flush=True)  # fmt: skip
            finally:
                shutdown_local(home)
    return segments, out


def main(a: Any, policies: tuple[str, ...]) -> None:
    """Run `policies` (those of them named in ``--policies``) and print the ratios."""
    names = tuple(n for n in policies if n in a.policies.split(","))
    if "plain --requeue" not in names:
        raise SystemExit(f"--policies must name 'plain --requeue' (the baseline) among {policies}")
    work_s = a.steps * a.step_s
    started = time.monotonic()
    segments, res = run_all(a, names)
    span = 2 * work_s / a.scale
    outages = [(s["at_s"], n["at_s"]) for s, n in itertools.pairwise(segments)
               if s["gpus"] < NODES * GPUS and s["at_s"] < span]  # fmt: skip
    print(
        f"emulator, seed {a.seed}, time scale {a.scale}, {NODES} nodes, "
        f"{work_s / a.scale / 3600:.2f} h of work, discount {a.discount}; "
        f"{time.monotonic() - started:.0f} s real"
    )
    print(f"trace (platform min, 8 of 16 GPUs withdrawn, mean every {a.between_min:g} min for "
          f"{a.outage_min:g} min): " + ", ".join(
        f"{a0 / 60:.0f}-{b0 / 60:.0f}" for a0, b0 in outages))  # fmt: skip
    base = res["plain --requeue"]
    print(f"{'policy':16} {'hours':>7} {'cost':>8} {'time/plain':>11} {'cost/plain':>11}  restarts"
          "  placements (P preemptible, S standard node)")  # fmt: skip
    for n in names:
        r = res[n]
        extra = ""
        if r.deadline_h is not None:
            extra = f"  deadline {r.deadline_h:.2f} h met: {'yes' if r.deadline_met else 'NO'}"
        print(f"{n:16} {r.hours:7.2f} {r.cost:8.1f} {r.hours / base.hours:11.2f} "
              f"{r.cost / base.cost:11.2f}  {r.restarts:8d}  {r.classes}{extra}")  # fmt: skip
    if "deadline" in res and "all-standard" in res:
        ratio = res["deadline"].cost / res["all-standard"].cost
        print(f"deadline cost / all-standard cost: {ratio:.2f}")
