"""Time to finish and GPU cost of the recovery policies under one seeded capacity trace, as ratios
to the seed's plain ``--requeue`` script, printed in one run.

    python bench/recovery.py [--seed 7] [--nodes 4] [--hours 8] [--discount 0.4] [--runs 20]
    python bench/recovery.py --engine emulator [--seed 7] [--scale 0.005] [--steps 300]

``--engine emulator`` runs each policy for real on the emulator under one seeded trace
(bench/recovery_emulator.py, a few minutes). The default, ``--engine model``, is a simulation of the *policy*, not of the engines: the decisions come from the real
`tgnb.runs.recovery.decide`, the world is a minute-by-minute model. The trace: the cluster's
preemptible capacity (in nodes) is withdrawn at random (a seeded Poisson process, about one
withdrawal every two hours, down to 0..nodes-1 nodes for an exponential 20-90 minutes) and then
restored; standard nodes are always there. The job needs `--hours` of work at `--nodes` nodes;
at fewer nodes it progresses proportionally (the global batch is kept, so each step takes longer).

- A preemption of a node the run holds stops it: tgnb checkpoints in the drain window and loses at
  most one step (1 min here); the plain script loses what it did since its last periodic
  checkpoint (every 30 min, as the seed's ``--checkpoint-interval``). Every restart costs 3 min.
- ``plain --requeue``: ``--nodes=N --constraint=preemptible --requeue``: waits for N preemptible
  nodes. ``wait``/``shrink``/``standard``: `RecoveryPolicy(when_short=...)` (wait_s 10 min).
  ``deadline``: wait plus a deadline of 1.5x the work; ``all-standard``: standard nodes only.
- Cost: GPU-hours, preemptible at a flat discount (``--discount``, the fraction of the standard
  price paid), counted per node class. Figures are the mean over ``--runs`` traces of the seed.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

from tgnb.runs.recovery import Facts, RecoveryPolicy, decide

GPUS, RESTART_MIN, PLAIN_CKPT_MIN = 8, 3, 30
POLICIES = ("plain --requeue", "wait", "shrink", "standard", "deadline", "all-standard")


def trace(rng: random.Random, nodes: int, minutes: int) -> list[int]:
    """Preemptible nodes available at each minute."""
    cap, t = [nodes] * minutes, 0
    while True:
        t += int(rng.expovariate(1 / 120)) + 1
        if t >= minutes:
            return cap
        low, span = rng.randint(0, nodes - 1), int(rng.uniform(20, 90))
        for m in range(t, min(minutes, t + span)):
            cap[m] = low
        t += span


@dataclass
class Result:
    minutes: int = 0
    cost: float = 0.0  # standard GPU-hours equivalent
    deadline_met: bool = True


def simulate(name: str, cap: list[int], nodes: int, work: float, discount: float) -> Result:
    """`work`: node-minutes at full size. One run of the job under `cap`."""
    plain = name == "plain --requeue"
    policy = {
        "wait": RecoveryPolicy(),
        "shrink": RecoveryPolicy(when_short="shrink", wait_s=600),
        "standard": RecoveryPolicy(when_short="standard", wait_s=600),
        "deadline": RecoveryPolicy(deadline=1.5 * work / nodes * 60),
        "plain --requeue": RecoveryPolicy(),
        "all-standard": RecoveryPolicy(),
    }[name]
    done, since_ckpt, res = 0.0, 0.0, Result()
    held, cls, overhead, short = 0, "preemptible", 0, 0
    step = 1.0  # node-minutes of work in one "step" at full size (per node)
    for t in range(len(cap) * 4):
        free = cap[t] if t < len(cap) else nodes
        if held and cls == "preemptible" and free < held:  # preempted
            lost = since_ckpt if plain else min(since_ckpt, step * held)
            done, held, since_ckpt = done - lost, 0, 0.0
        if held and cls == "standard" and name != "all-standard":
            back = decide(policy, _facts(nodes, free, 0, t, done, work))
            if back.action == "start" and back.node_class == "preemptible":
                held, since_ckpt = 0, 0.0  # checkpoint and move: at most one step lost
        if not held:
            if name == "all-standard":
                d_nodes, d_cls = nodes, "standard"
            else:
                d = decide(policy, _facts(nodes, free, short * 60, t, done, work))
                if d.action == "wait":
                    short += 1
                    continue
                d_nodes, d_cls = d.nodes, d.node_class
            held, cls, overhead, short = d_nodes, d_cls, RESTART_MIN, 0
        price = GPUS * held / 60 * (1.0 if cls == "standard" else discount)
        res.cost += price
        if overhead:
            overhead -= 1
        else:
            done += held
            since_ckpt = (
                0.0 if plain and since_ckpt + held >= PLAIN_CKPT_MIN * nodes else since_ckpt + held
            )
        if done >= work:
            res.minutes = t + 1
            if policy.deadline is not None:
                res.deadline_met = res.minutes * 60 <= policy.deadline
            return res
    res.minutes = len(cap) * 4
    res.deadline_met = False
    return res


def _facts(nodes: int, free: int, short_s: float, t: int, done: float, work: float) -> Facts:
    return Facts(
        nodes=nodes, min_nodes=1, free={"preemptible": free, "standard": nodes},
        short_for_s=short_s, allocated_gpus=free * GPUS, desired_gpus=nodes * GPUS,
        now=t * 60.0, started=0.0, steps_done=int(done), steps_total=int(work),
        step_s=60.0 / nodes, restart_s=RESTART_MIN * 60.0,
    )  # fmt: skip


def main() -> None:
    names = POLICIES
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--hours", type=float, default=8.0)
    p.add_argument("--discount", type=float, default=0.4)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--engine", choices=("model", "emulator"), default="model")
    e = p.add_argument_group("--engine emulator")
    e.add_argument("--scale", type=float, default=0.005, help="the emulator's time scale")
    e.add_argument("--steps", type=int, default=300, help="the stand-in's max_steps")
    e.add_argument("--step-s", type=float, default=0.1, help="real seconds a step takes")
    e.add_argument("--plain-every-min", type=float, default=PLAIN_CKPT_MIN,
                   help="the plain script's periodic checkpoint, platform minutes")  # fmt: skip
    e.add_argument("--between-min", type=float, default=40.0,
                   help="the trace: mean platform minutes between withdrawals")  # fmt: skip
    e.add_argument("--outage-min", type=float, default=25.0,
                   help="the trace: mean platform minutes a withdrawal lasts")  # fmt: skip
    e.add_argument("--policies", default=",".join(names),
                   help="comma-separated, the plain one included (default: all)")  # fmt: skip
    a = p.parse_args()
    if a.engine == "emulator":
        from recovery_emulator import main as real_runs

        real_runs(a, POLICIES)
        return
    rng = random.Random(a.seed)
    work = a.hours * 60 * a.nodes
    totals = {n: [0.0, 0.0, 0] for n in names}
    for _ in range(a.runs):
        cap = trace(rng, a.nodes, int(a.hours * 60 * 3))
        for n in names:
            r = simulate(n, cap, a.nodes, work, a.discount)
            totals[n][0] += r.minutes / a.runs
            totals[n][1] += r.cost / a.runs
            totals[n][2] += int(r.deadline_met)
    base_t, base_c = totals["plain --requeue"][:2]
    print(
        f"{a.runs} traces (seed {a.seed}), {a.nodes} nodes, {a.hours} h of work, discount {a.discount}"
    )
    print(f"{'policy':16} {'hours':>7} {'cost':>8} {'time/plain':>11} {'cost/plain':>11}")
    for n in names:
        t, c, met = totals[n]
        extra = f"  deadline met {met}/{a.runs}" if n == "deadline" else ""
        print(f"{n:16} {t / 60:7.2f} {c:8.1f} {t / base_t:11.2f} {c / base_c:11.2f}{extra}")
    dl, std = totals["deadline"], totals["all-standard"]
    print(f"deadline cost / all-standard cost: {dl[1] / std[1]:.2f}")


if __name__ == "__main__":
    main()
