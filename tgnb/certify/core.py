"""`certify`: the user's own program run twice on the local emulator, side by side — once
uninterrupted, once under the chaos schedule (`tgnb.certify.chaos`) — and the `Certificate`
(`tgnb.certify.report`) of how the second kept up with the first.

Both runs get the same periodic saves (``every_steps``: `SAVE_EVERY`, certify's setting, so that a
save can be caught in flight and a kill loses at most one interval) and a short backoff after a
failure (a kill is one). What is missing is named from what the runs wrote, never from the source
alone: no ``RunStarted`` record (no hook), an exit 0 after a notice, the first step whose learning
rate or whose parameters differ from the uninterrupted run's.
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tgnb.certify import report, state
from tgnb.certify.chaos import Driver
from tgnb.certify.report import Certificate, Finding
from tgnb.errors import ValidationError
from tgnb.events import RUN_STARTED

SAVE_EVERY = 5
BACKOFF = {"backoff_s": 1.0, "max_restarts": 5}
NOT_YET = [("shrink to fewer nodes", "not driven by this version: certify runs one node")]


def _shape(what: Any, command: Sequence[str] | None, workdir: Path) -> str:
    """The program's kind, from its source, for naming the fix: lightning, trainer or loop."""
    script = workdir / str(what) if what and not command else None
    text = (
        script.read_text(encoding="utf-8", errors="replace") if script and script.is_file() else ""
    )
    if "lightning" in text:
        return "lightning"
    if "Trainer" in text and ("transformers" in text or "trl" in text):
        return "trainer"
    return "loop"


HOOK_FIX = {
    "lightning": "call tgnb.train.protect(trainer) on the Lightning Trainer before trainer.fit()",
    "trainer": "call tgnb.train.protect(trainer) before trainer.train()",
    "loop": "drive the loop with tgnb.train.Checkpointer(model, optimizer, scheduler, "
    "max_steps=...) and `for step in ckpt.steps():`",
}


def _first_difference(ref: list[dict[str, Any]], got: list[dict[str, Any]], key: str) -> int | None:
    want = {int(r["step"]): r.get(key) for r in ref if "step" in r}
    for row in got:
        step = int(row.get("step", 0))
        if key in row and step in want and want[step] is not None and row[key] != want[step]:
            return step
    return None


def diagnose(cert: Certificate, ref_run: Any, run: Any, shape: str) -> list[Finding]:
    """What is missing, from what the two runs wrote."""
    found: list[Finding] = []
    ref_rows, rows = ref_run.records("metrics"), run.records("metrics")
    if not any(e.reason == RUN_STARTED and e.source == "run" for e in ref_run.run_events()):
        what = "Lightning Trainer without protect" if shape == "lightning" else "no hook"
        found.append(Finding(f"{what}: the program never calls tgnb's hook, so a preemption "
                             "restarts it from step 0", HOOK_FIX[shape]))  # fmt: skip
        return found
    ref_last = max((int(r["step"]) for r in ref_rows), default=0)
    last = max((int(r["step"]) for r in rows), default=0)
    short = run.state.value == "succeeded" and last < ref_last
    if report.exited_zero_after_notice(cert.events, run.run_events(), short):
        found.append(Finding(
            f"exits 0 on SIGTERM: it stopped at step {last} of {ref_last} without a checkpoint "
            "of its own (tgnb restarts it; the steps since the last save are lost)",
            "leave SIGTERM to tgnb (no signal handler of your own that exits 0): it checkpoints "
            "and exits 75, and the run resumes"))  # fmt: skip
        return found
    for ev, lost in zip(cert.events, cert.lost, strict=True):
        if ev.kind in report.NOTICE and lost is not None and lost[1] > 1:
            found.append(
                Finding(
                    f"{lost[1]} steps lost to a {ev.label}",
                    "let tgnb checkpoint on the notice (protect / Checkpointer)",
                )
            )
    if cert.state.ok or cert.state.verdict == "missing":
        return found
    if (step := _first_difference(ref_rows, rows, "learning_rate")) is not None:
        found.append(Finding(f"scheduler not restored: the learning rate differs from step {step}",
                             "pass the scheduler to tgnb (Checkpointer(model, optimizer, "
                             "scheduler, ...)) so it is saved and restored"))  # fmt: skip
        return found
    newest = state.newest(run.run_dir)
    loss = next((k for k in ("loss", "train_loss") if any(k in r for r in rows)), None)
    at = _first_difference(ref_rows, rows, loss) if loss else None
    where = f" (first differs at step {at})" if at is not None else ""
    if newest is not None and not state.saved_data_position(newest.path):
        found.append(Finding(f"data position not saved: the resumed run trains on other "
                             f"batches{where}", "add the sampler or the data position to the "
                             "checkpoint: ckpt.add_state('data', sampler)"))  # fmt: skip
    else:
        found.append(Finding(f"RNG not restored: a generator of the program's own is not in the "
                             f"checkpoint{where}", "draw from the global RNG (tgnb restores it) or save the "
                             "generator with ckpt.add_state(...)"))  # fmt: skip
    return found


def certify(
    session: Any,
    what: str | os.PathLike[str] | None = None,
    *,
    args: Sequence[str] | None = None,
    command: Sequence[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    seed: int | None = None,
    budget_s: float = 900.0,
    save_every: int = SAVE_EVERY,
) -> Certificate:
    """Certify `what` (a script, with `args`) or `command` on the session's local emulator."""
    if session.emulator is None:
        raise ValidationError("certify runs on the local emulator: tgnb.attach(local=True)")
    if budget_s <= 0:
        raise ValidationError(f"budget_s must be above 0, not {budget_s!r}: e.g. budget_s=600")
    started = time.monotonic()
    wd = Path(workdir) if workdir is not None else Path.cwd()  # for naming the fix only
    seed = secrets.randbelow(10_000) if seed is None else seed
    tag = secrets.token_hex(3)
    stem = Path(str(what or (command or ["command"])[0])).stem.replace("_", "-").lower()[:20]
    common: dict[str, Any] = {
        "args": list(args) if args else None,
        "command": list(command) if command else None,
        "workdir": workdir,
        "checkpoint": {"every_steps": save_every, "drain_poll_seconds": 0.2},
        "recovery": BACKOFF,
    }
    ref = session.launch(what, name=f"certify-{stem}-ref-{tag}", **common)
    run = session.launch(what, name=f"certify-{stem}-chaos-{tag}", **common)
    until = started + budget_s
    driver = Driver(session, run, ref, until, random.Random(seed))
    try:
        events = driver.schedule()
        left = max(1.0, until - time.monotonic())
        run.wait(timeout=left, progress=False)
        ref.wait(timeout=max(1.0, until - time.monotonic()), progress=False)
    except TimeoutError:
        events = driver.events
    finally:
        for r in (ref, run):
            if not r.state.finished:
                r.stop()
    rows, evs = run.records("metrics"), run.run_events()
    cert = Certificate(
        target=" ".join([str(what or ""), *(command or []), *(args or [])]).strip(),
        events=events,
        lost=[report.steps_lost(ev, rows, evs) for ev in events],
        twice=report.logged_twice(rows),
        state=state.compare(ref.run_dir, run.run_dir),
        not_done=list(NOT_YET),
        seed=seed,
    )
    cert.findings = diagnose(cert, ref, run, _shape(what, command, wd))
    cert.wall_s = time.monotonic() - started
    return cert
