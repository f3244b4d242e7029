"""What the server extension sends to the browser: plain JSON of clusters, runs and events.

Only the fields listed here leave the server. A `ClusterState` holds no ``kube_config`` and no key,
and nothing below reads the `Cloud`'s settings, so the API key never reaches a response. Every
string goes through `tgnb.markup.plain` (no bidi or C0 control characters reach the sidebar, which
renders them as text).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgnb.events import Event, format_time
from tgnb.markup import plain_json
from tgnb.runs.replicas import group_lines
from tgnb.runs.summary import last_step
from tgnb.runs.trainconfig import SCRIPT

if TYPE_CHECKING:
    from tgnb.cloud import ClusterState, NodeState
    from tgnb.prices import Prices
    from tgnb.runs.run import Run
    from tgnb.runs.sweeps import Sweep
    from tgnb.session import Session


def node_json(node: NodeState) -> dict[str, Any]:
    return {
        "name": node.name,
        "kind": node.kind,
        "gpus": node.gpus,
        "status": node.status,
        "phase": node.phase,
        "since": format_time(node.phase_since) if node.phase_since else None,
    }


def cluster_json(state: ClusterState, session: Session | None = None) -> dict[str, Any]:
    """The attached cluster: preemptible target (desired) against allocated, and its nodes."""
    out: dict[str, Any] = {
        "id": state.id,
        "name": state.name,
        "type": state.type,
        "status": state.status,
        "phase": state.phase,
        "region": state.region,
        "gpu_type": state.gpu_type,
        "standard_gpus": state.num_gpus,
        "desired_preemptible_gpus": state.desired_preemptible_gpus,
        "allocated_preemptible_gpus": state.allocated_preemptible_gpus,
        "capacity_reached": state.capacity_reached,
        "nodes": [node_json(n) for n in state.nodes],
        "fetched_at": format_time(state.fetched_at),
        "prices": _prices_json(state.prices()),
    }
    if session is not None:
        out["backend"] = session.backend_name
        out["local"] = session.emulator is not None
    return plain_json(out)


def _prices_json(prices: Prices | None) -> dict[str, Any] | None:
    """Dollars per GPU-hour of each node class, and where they came from."""
    if prices is None:
        return None
    return {
        "standard": prices.standard,
        "preemptible": prices.preemptible,
        "currency": prices.currency,
        "source": prices.source,
    }


def _step(run: Run) -> int | None:
    """The run's last step; None when its program reports no steps (no metrics, no hook of
    tgnb's: a script that never imports tgnb, a command), never 0."""
    script = run.record.spec.train.algorithm == SCRIPT
    return last_step(run.records("metrics"), run.run_events(), script)


def run_json(run: Run, detail: bool = False) -> dict[str, Any]:
    """One run: status, restarts, nodes and progress (optimizer steps done against max_steps)."""
    st = run.report()  # the engine's word (an error it gave is in `detail`)
    rec = run.record
    step = _step(run)
    total = run.max_steps()
    out: dict[str, Any] = {
        "id": rec.id,
        "name": rec.name,
        "state": st.state.value,
        "finished": st.state.finished,
        "backend": rec.backend,
        "algorithm": rec.spec.train.algorithm,
        "restart_count": st.restart_count,
        "nodes": list(st.nodes),
        "exit_code": st.exit_code,
        "detail": st.detail,
        "created_at": rec.created_at,
        "step": step,
        "max_steps": total,
        "progress": min(1.0, step / total) if total and step is not None else None,
        **run.spending(),  # gpu_hours, cost_usd (None: no price known), budget_usd
        # replica groups (fault_tolerance="torchft"): who left, joined, healed; [] for others
        "groups": group_lines(run.run_events()),
    }
    if detail:
        out["history"] = [
            {"time": h.time, "state": h.state.value, "detail": h.detail, "node": h.node}
            for h in run.history()
        ]
        out["events"] = [e.to_dict() for e in run.run_events()]
    return plain_json(out)


def sweep_json(sweep: Sweep, detail: bool = False) -> dict[str, Any]:
    """One sweep: its runs by state, its dollars so far, its best run; with `detail`, its table
    (a row per run: `tgnb.runs.sweeps.SweepRow`)."""
    from tgnb.runs.spec import JobState
    from tgnb.runs.sweeps import best_run

    rows = sweep.rows()
    states: dict[str, int] = {}
    for r in rows:
        states[r.state] = states.get(r.state, 0) + 1
    best = best_run(rows, sweep.mode)
    top = next((r for r in rows if r.run == best), None)
    known = [r.cost_usd for r in rows if r.cost_usd is not None]
    out: dict[str, Any] = {
        "name": sweep.name,
        "source": sweep.record.source,
        "created_at": sweep.record.created_at,
        "runs": [r.run for r in rows],
        "states": states,
        "finished": all(JobState(r.state).finished for r in rows),
        "cost_usd": round(sum(known), 4) if known else None,
        "best": best,
        "best_metric": None if top is None else top.metric,
        "best_value": None if top is None else top.best,
    }
    if detail:
        out["rows"] = [
            {
                "run": r.run,
                "state": r.state,
                "steps": r.steps,
                "max_steps": r.max_steps,
                "lost": r.lost,
                "preemptions": r.preemptions,
                "restarts": r.restarts,
                "cost_usd": r.cost_usd,
                "metric": r.metric,
                "best": r.best,
                "best_step": r.best_step,
                "note": r.note,
            }
            for r in rows
        ]
    return plain_json(out)


def event_json(event: Event) -> dict[str, Any]:
    return plain_json(event.to_dict())


def leftovers_json(home: Path) -> dict[str, Any]:
    """The Post-Training model resources tgnb created that still bill while the process that
    created them is gone (`tgnb.ptregistry`), each with what it has cost from the platform's own
    numbers, and the command that stops them. No request is sent unless the registry holds an
    entry whose process is gone."""
    from tgnb.ptregistry import STOP_HINT, Registry, describe

    out: dict[str, Any] = {"leftovers": [], "stop": STOP_HINT}
    if not Registry(home).any_gone():
        return out
    from tgnb.posttraining import post_training

    for left in post_training().leftovers():
        b = left.billed
        out["leftovers"].append(
            {
                "id": left.resource_id,
                "base_model": left.base_model,
                "gpus": left.gpus,
                "status": left.status,
                "since": None if b.since is None else b.since.isoformat(),
                "cost": b.amount,
                "currency": b.currency,
                "per_hour": b.price_per_hour,
                "source": b.source,
                "line": describe(left),
            }
        )
    return plain_json(out)
