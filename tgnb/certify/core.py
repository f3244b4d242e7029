"""`certify`: the user's own program run twice on the local emulator, side by side — once
uninterrupted, once under the chaos schedule (`tgnb.certify.chaos`) — and the `Certificate`
(`tgnb.certify.report`) of how the second kept up with the first.

Both runs are launched as a real launch runs the program: its own checkpoint policy (under tgnb,
the launch's: ``checkpoint.auto`` unless set), so that what the certificate says a kill costs is
what a real launch risks; only `save_every` (``--save-every``), when given, sets an interval of
certify's own (``every_steps``). Both get a short backoff after a failure (a kill is one). The
interval each run announced (``CheckpointIntervalChosen``) goes into the certificate: the
uninterrupted run's last, and the one before each event of the other. What is missing is named
from what the runs wrote, never from the source alone: no ``RunStarted`` record (no hook), an exit
0 after a notice, the first step whose learning rate or whose parameters differ from the
uninterrupted run's.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import random
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tgnb.certify import groupchaos, groups, report, state
from tgnb.certify.chaos import KINDS, Driver, Fired
from tgnb.certify.report import Certificate, Finding
from tgnb.errors import ValidationError
from tgnb.events import RUN_STARTED
from tgnb.runs import ft
from tgnb.runs.ftcheck import torchft_missing
from tgnb.runs.spec import GPUS_PER_NODE

BACKOFF = {"backoff_s": 1.0, "max_restarts": 5}
#: A shrink's wait (`RecoveryPolicy.wait_s`), in platform seconds: past the drain window (300 s)
#: and a replacement's provisioning (60 s), so that only the shrink event's capped capacity, not a
#: preemption whose replacement is on its way, makes the run shrink.
SHRINK_WAIT_S = 1.5 * (300.0 + 60.0)
#: Free preemptible nodes kept beside the two runs when the run may shrink: a preempted node's
#: replacement takes a while, a restart finds one of these at once.
SPARE_NODES = 2


def _shrink_missing(nodes: int, min_nodes: int | None) -> list[tuple[str, str]]:
    if nodes < 2:
        why = "the program runs on one node: certify it with nodes=2, min_nodes=1 (--nodes 2 --min-nodes 1)"
    elif min_nodes is None or min_nodes >= nodes:
        why = f"min_nodes does not allow it: give min_nodes below {nodes} (--min-nodes 1)"
    else:
        return []
    return [("shrink to fewer nodes", why)]


def _left_out(only: Sequence[str], nodes: int, min_nodes: int | None) -> list[tuple[str, str]]:
    """The events not driven, with why: not asked for, or a shrink the run cannot make."""
    left = [(kind, "left out (events=...)") for kind in KINDS if kind not in only]
    return left + (_shrink_missing(nodes, min_nodes) if "shrink" in only else [])


def _raise_target(session: Any, nodes: int) -> int | None:
    """Raise the cluster's preemptible target to `nodes` nodes if it is lower (this is the local
    emulator: it costs nothing) and wait for them; the target before (None: left as it was)."""
    before = int(session.status().desired_preemptible_gpus)
    if before >= nodes * GPUS_PER_NODE:
        return None
    session.scale(preemptible=nodes * GPUS_PER_NODE, wait=True, timeout=120, poll=0.2)
    return before


def run_stem(what: Any, command: Sequence[str] | None) -> str:
    """The program's name as a piece of a valid run name (``train.v2.py``, ``my train.py`` ->
    ``train-v2``, ``my-train``): lowercase letters and digits, one '-' between."""
    name = Path(str(what or (command or ["command"])[0])).stem.lower()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")[:20].strip("-") or "program"


def _source(what: Any, command: Sequence[str] | None, workdir: Path) -> str:
    script = workdir / str(what) if what and not command else None
    if script is None or not script.is_file():
        return ""
    return script.read_text(encoding="utf-8", errors="replace")


def unseeded_loader(text: str) -> bool:
    """Whether the program's source makes a ``DataLoader(...)`` with no ``generator=`` (read, not
    run: `ast`)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            f = call.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            if name == "DataLoader" and not any(k.arg == "generator" for k in call.keywords):
                return True
    return False


def _shape(what: Any, command: Sequence[str] | None, workdir: Path) -> str:
    """The program's kind, from its source, for naming the fix: lightning, trainer or loop (a
    loop with a ``DataLoader`` and no ``generator=``: ``loader``)."""
    text = _source(what, command, workdir)
    if "lightning" in text:
        return "lightning"
    if "Trainer" in text and ("transformers" in text or "trl" in text):
        return "trainer"
    return "loader" if unseeded_loader(text) else "loop"


HOOK_FIX = {
    "lightning": "call tgnb.train.protect(trainer) on the Lightning Trainer before trainer.fit()",
    "trainer": "call tgnb.train.protect(trainer) before trainer.train()",
    "loop": "drive the loop with tgnb.train.Checkpointer(model, optimizer, scheduler, "
    "max_steps=...) and `for step in ckpt.steps():`",
}
HOOK_FIX["loader"] = HOOK_FIX["loop"]


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
    elif shape == "loader":  # its shuffle's seed: drawn from the global RNG at iter(loader)
        found.append(Finding(f"RNG not restored: the DataLoader has no generator=, so its shuffle "
                             f"seed is drawn from the global RNG when its iterator is made, at "
                             f"another point after the resume{where}", "give the DataLoader a "
                             "generator of its own: DataLoader(..., shuffle=True, generator="
                             "torch.Generator().manual_seed(seed)), and save the data position "
                             "with ckpt.add_state('data', ...)"))  # fmt: skip
    else:
        found.append(Finding(f"RNG not restored: a generator of the program's own is not in the "
                             f"checkpoint{where}", "draw from the global RNG (tgnb restores it) or save the "
                             "generator with ckpt.add_state(...)"))  # fmt: skip
    return found


def _run_both(
    session: Any,
    what: Any,
    names: tuple[str, str],
    common: dict[str, Any],
    shrink_to: int | None,
    until: float,
    rng: random.Random,
    only: Sequence[str],
) -> tuple[Any, Any, list[Fired]]:
    """Launch the uninterrupted run and the chaos run (`shrink_to`: the fewest nodes it may
    shrink to), drive the schedule, wait for both until `until`; the runs and the events."""
    ref = session.launch(what, name=names[0], **common)
    if shrink_to is not None:
        wait_s = SHRINK_WAIT_S * (session.emulator.time_scale() or 1.0)
        common = {**common, "min_nodes": shrink_to,
                  "recovery": {**BACKOFF, "when_short": "shrink", "wait_s": wait_s}}  # fmt: skip
    run = session.launch(what, name=names[1], **common)
    kind = groupchaos.GroupDriver if common.get("fault_tolerance") else Driver
    driver = kind(session, run, ref, until, rng, common["nodes"], shrink_to is not None)
    try:
        events = driver.schedule(only)
        run.wait(timeout=max(1.0, until - time.monotonic()), progress=False)
        ref.wait(timeout=max(1.0, until - time.monotonic()), progress=False)
    except TimeoutError:
        events = driver.events
    finally:
        for r in (ref, run):
            if not r.state.finished:
                r.stop()
    return ref, run, events


def certify(
    session: Any,
    what: str | os.PathLike[str] | None = None,
    *,
    args: Sequence[str] | None = None,
    command: Sequence[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    seed: int | None = None,
    budget_s: float = 900.0,
    save_every: int | None = None,
    nodes: int = 1,
    min_nodes: int | None = None,
    events: Sequence[str] | None = None,
    fault_tolerance: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Certificate:
    """Certify `what` (a script, with `args`) or `command` on the session's local emulator, on
    `nodes` nodes; with `min_nodes` below `nodes`, a shrink to fewer nodes is one of the events
    (the cluster's preemptible target is raised for the while if it is too low for both runs).
    `events`: drive only these (`tgnb.certify.chaos.KINDS`); the others are listed NOT DONE.
    `save_every`: a periodic interval of certify's own, in steps (default: the program's policy,
    as a launch runs it). `fault_tolerance="torchft"`: the program runs as replica groups, one per
    node (nodes >= 2), and is certified by the checks of `tgnb.certify.groups` instead of the
    final parameters; `env`: the program's environment, as a launch's."""
    if session.emulator is None:
        raise ValidationError("certify runs on the local emulator: tgnb.attach(local=True)")
    if (
        isinstance(budget_s, bool)
        or not isinstance(budget_s, int | float)
        or not (math.isfinite(budget_s) and budget_s > 0)
    ):  # NaN compares false with everything: it never ran out (a hang)
        raise ValidationError(
            f"budget_s must be a number of seconds above 0, not {budget_s!r}: e.g. budget_s=600"
        )
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ValidationError(f"nodes must be a whole number from 1, not {nodes!r}: e.g. nodes=2")
    if min_nodes is not None and (not isinstance(min_nodes, int) or not 1 <= min_nodes <= nodes):
        raise ValidationError(
            f"min_nodes must be from 1 to nodes ({nodes}), not {min_nodes!r}: e.g. min_nodes=1"
        )
    if save_every is not None and (isinstance(save_every, bool) or not isinstance(save_every, int)
                                   or save_every < 1):  # fmt: skip
        raise ValidationError(f"save_every must be a whole number of steps from 1, not "
                              f"{save_every!r}: e.g. save_every=50, or leave it out")  # fmt: skip
    only = tuple(KINDS if events is None else events)
    if unknown := [k for k in only if k not in KINDS]:
        raise ValidationError(f"no certify event {unknown[0]!r}: choose from {', '.join(KINDS)}")
    check_fault_tolerance(fault_tolerance, nodes, min_nodes)
    started = time.monotonic()
    wd = Path(workdir) if workdir is not None else Path.cwd()  # for naming the fix only
    seed = secrets.randbelow(10_000) if seed is None else seed
    tag = secrets.token_hex(3)
    stem = run_stem(what, command)
    common: dict[str, Any] = {
        "args": list(args) if args else None,
        "command": list(command) if command else None,
        "workdir": workdir,
        "checkpoint": {"drain_poll_seconds": 0.2}
        | ({"every_steps": save_every} if save_every is not None else {}),
        "recovery": BACKOFF,
        "nodes": nodes,
    } | ({"env": dict(env)} if env else {})
    if fault_tolerance:
        common["fault_tolerance"] = fault_tolerance
    shrinks = "shrink" in only and not _shrink_missing(nodes, min_nodes) and not fault_tolerance
    spare = SPARE_NODES if shrinks or fault_tolerance else 0  # a preempted group's replacement
    scaled = _raise_target(session, 2 * nodes + spare)
    try:
        names = (f"certify-{stem}-ref-{tag}", f"certify-{stem}-chaos-{tag}")
        ref, run, fired = _run_both(session, what, names, common, min_nodes if shrinks else None,
                                     started + budget_s, random.Random(seed), only)  # fmt: skip
    finally:
        if scaled is not None:
            session.scale(preemptible=scaled)
    if fault_tolerance:
        cert = _groups_certificate(ref, run, fired, only)
    else:
        cert = _certificate(ref, run, fired, only, nodes, min_nodes)
        cert.findings = diagnose(cert, ref, run, _shape(what, command, wd))
    cert.target = " ".join([str(what or ""), *(command or []), *(args or [])]).strip()
    cert.seed, cert.save_every, cert.runs = seed, save_every, names
    cert.wall_s = time.monotonic() - started
    return cert


def check_fault_tolerance(fault_tolerance: str | None, nodes: int, min_nodes: int | None) -> None:
    """Refuse a fault-tolerant certify that cannot run, in one line naming the fix (nothing is
    launched)."""
    if fault_tolerance is None:
        return
    if fault_tolerance != ft.TORCHFT:
        raise ValidationError(f"fault_tolerance must be {ft.TORCHFT!r} or left out, not "
                              f"{fault_tolerance!r:.60}: e.g. fault_tolerance='torchft' (--fault-tolerance "
                              "torchft)")  # fmt: skip
    if nodes < 2:
        raise ValidationError("fault_tolerance='torchft' needs nodes=2 or more, one replica group "
                              "per node: e.g. nodes=2 (--nodes 2)")  # fmt: skip
    if min_nodes is not None:
        raise ValidationError("min_nodes shrinks a run that restarts as a whole; replica groups "
                              "never restart together: drop min_nodes (--min-nodes)")  # fmt: skip
    if importlib.util.find_spec(ft.TORCHFT) is None:
        raise torchft_missing("in this Python environment")


def _groups_certificate(ref: Any, run: Any, fired: list[Fired], only: Sequence[str]) -> Certificate:
    """A fault-tolerant program's certificate: the checks of `tgnb.certify.groups`, each failed
    one a finding; the parameters not compared (`groups.NOT_COMPARED`)."""
    twice = report.logged_twice(run.records("metrics"))
    qs = groupchaos.quorums(run.run_dir)
    checks = groups.check(fired, run.run_events(), qs, groupchaos.quorums(ref.run_dir), twice,
                          run.state.value, ref.state.value)  # fmt: skip
    cert = Certificate(
        target="",
        events=fired,
        lost=[None] * len(fired),
        twice=twice,
        state=state.StateMatch("not compared", groups.NOT_COMPARED),
        not_done=groupchaos.left_out(only),
        checks=checks,
    )
    cert.findings = [Finding(f"{c.name}: {c.detail}", c.fix) for c in checks if not c.ok]
    return cert


def _certificate(ref: Any, run: Any, fired: list[Fired], only: Sequence[str], nodes: int,
                 min_nodes: int | None) -> Certificate:  # fmt: skip
    rows, evs = run.records("metrics"), run.run_events()
    return Certificate(
        target="",
        events=fired,
        lost=[report.steps_lost(ev, rows, evs) for ev in fired],
        twice=report.logged_twice(rows),
        state=state.compare(ref.run_dir, run.run_dir),
        not_done=_left_out(only, nodes, min_nodes),
        told=[report.announced(evs, ev.fired_at) if ev.done else None for ev in fired],
        risk=report.announced(ref.run_events()),
    )
