"""A stand-in for ``python -m tgnb.train`` used only by the supervisor tests that check placement
and signal handling without paying for TRL (the end-to-end tests run the real runtime).

It counts optimizer "steps" (a sleep each) up to ``max_steps`` from the config, writes
``metrics.jsonl`` and ``events.jsonl`` through the real `Recorder`, checkpoints (a JSON file with the
step) on SIGTERM or when ``TGNB_NOTICE_FILE`` appears, exits 75, and resumes from that file.
``STANDIN_STEP_SECONDS`` sets the time per step and ``STANDIN_IGNORE_SIGTERM`` makes it ignore the
signal and ``STANDIN_IGNORE_NOTICE`` the drain notice (to test the kill at the end of the drain
window); ``STANDIN_FAIL`` makes it fail (exit 1) at once. It also records the environment it was started with, for the tests to check.

It honours the config's ``checkpoint:`` section as the runtime does: ``every_steps`` saves
periodically, ``on_signal: false`` leaves SIGTERM to its default (the process dies, unsaved) and
``watch_drain: false`` ignores the drain notice. With ``STANDIN_FULL_NODES`` (the run's `nodes`)
a step takes ``STANDIN_STEP_SECONDS * full / world``, world being the nodes of this attempt (read
from the run store of ``TGNB_HOME``): the global batch is kept on fewer nodes, as the runtime does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from tgnb.train.record import Recorder


def _slowdown() -> float:
    """full / world with ``STANDIN_FULL_NODES`` set (1 otherwise)."""
    full = int(os.environ.get("STANDIN_FULL_NODES") or 0)
    if not full:
        return 1.0
    from tgnb.runs.store import RunStore

    rec = RunStore(os.environ["TGNB_HOME"]).find(os.environ["TGNB_RUN"])
    world = len(rec.nodes) if rec is not None and rec.nodes else full
    return full / world


def main() -> int:
    config = yaml.safe_load(Path(sys.argv[1]).read_text())
    if "spec" in config:  # the run file (run.json), as the node is started now: its training config
        config = config["spec"]["train"]
    run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
    max_steps = int(config.get("max_steps", 20))
    step_s = float(os.environ.get("STANDIN_STEP_SECONDS", "0.1")) * _slowdown()
    policy = config.get("checkpoint") or {}
    every = int(policy.get("every_steps") or 0)
    rec = Recorder(run_dir)
    ckpt = run_dir / "standin-checkpoint.json"
    with open(run_dir / "standin-env.jsonl", "a") as fh:
        keys = ("TGNB_NODE", "TGNB_RESTART_COUNT", "SLURM_RESTART_COUNT", "TGNB_NOTICE_FILE")
        fh.write(json.dumps({k: os.environ.get(k) for k in keys} | {"pid": os.getpid()}) + "\n")
    if os.environ.get("STANDIN_FAIL"):  # a failure (not a preemption): exit 1 before training
        print("standin: failing as asked (STANDIN_FAIL)", file=sys.stderr, flush=True)
        return 1
    step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    rec.event("RunResumed" if step else "RunStarted", step=step)
    stop = {"why": ""}
    if os.environ.get("STANDIN_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a process that ignores the signal
    elif policy.get("on_signal", True):
        signal.signal(signal.SIGTERM, lambda *_: stop.update(why="signal"))
    ignore = os.environ.get("STANDIN_IGNORE_NOTICE") or not policy.get("watch_drain", True)
    notice = None if ignore else os.environ.get("TGNB_NOTICE_FILE")
    while step < max_steps:
        if notice and Path(notice).exists():
            stop["why"] = "drain"
        if stop["why"]:
            ckpt.write_text(json.dumps({"step": step}))
            rec.event("CheckpointSaved", step=step, why=stop["why"])
            rec.event("RunExited", step=step, exit_code=75)
            return 75
        time.sleep(step_s)
        step += 1
        rec.metric(step, loss=1.0 / step)
        if every and step % every == 0 and step < max_steps:  # periodic: written, then renamed
            tmp = ckpt.with_name(f"{ckpt.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"step": step}))
            tmp.replace(ckpt)
            rec.event("CheckpointSaved", step=step, why="periodic")
    rec.event("RunExited", step=step, exit_code=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
