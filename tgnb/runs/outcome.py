"""How one attempt of a run ended, read from what the runtime recorded, then from the exit code.

The one classification every engine uses. The runtime (`tgnb.train.protect`, the `Checkpointer`,
the Lightning callback: one `CheckpointGuard`) records its outcome in the run directory's
``events.jsonl``: ``RunStarted`` when it starts, ``RunExited`` when it ends (``preempted`` with the
step of the checkpoint it sealed, ``finished``, ``failed`` with its line). A launcher between the
engine and the program (torchrun, ``accelerate launch``) may hide the program's exit code (it exits
1 or 143 after tgnb's own SIGTERM and a sealed checkpoint), so the record comes first:

1. the attempt recorded a preemption with a sealed checkpoint: *preempted*, whatever the exit code
   (`Exit.PREEMPTED`; never counted against the restart budget);
2. an exit after tgnb signalled the attempt (a SIGTERM, a drain notice) with no checkpoint sealed
   on stopping, no ``finished`` or ``failed`` record and no "resume me" code -- exit 0, or the 143
   or 1 of a launcher whose program exited 0, or a program SIGTERM killed after it trained a
   step not saved; not a node lost at the drain window's end, rule 4): *unsaved*, not a
   success: the run starts again, uncounted, and the cockpit says "stopped without a checkpoint
   at step N: K steps lost";
3. exit 0: *succeeded*;
4. a "resume me" code, or the attempt was signalled or its node lost: *preempted*;
5. anything else: *failed*, with the recorded line when there is one.

The node side applies the same rules (`node_exit`) to the exit code the engine will see, so the
engines that act on exit codes alone (Kubernetes' pod failure policy, the sbatch script) see 75
after a sealed preemption checkpoint; the local supervisor, which knows when it signalled, calls
`classify`. Light: no torch, no engine library.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tgnb.events import CHECKPOINT_SAVED, RUN_EXITED, RUN_STARTED
from tgnb.runs import node
from tgnb.runs.node import Exit

Kind = Literal["succeeded", "preempted", "unsaved", "failed"]
#: What the cockpit says of a run whose program never called protect or the Checkpointer.
UNPROTECTED = "unprotected: a preemption restarts it from step 0"
#: ``RunExited``'s ``exit_reason`` of a stop that sealed a checkpoint: a preemption's, or the
#: budget's (a SIGTERM tgnb sent at the run's budget: `tgnb.runs.budget.stopped_since`).
SEALED_STOPS = ("preempted", "budget")
#: ``RunExited``'s ``exit_reason`` for an attempt stopped by tgnb's signal with nothing sealed.
UNSAVED = "unsaved"


def events_size(run_dir: str | os.PathLike[str]) -> int:
    """The size of the run's ``events.jsonl`` now: where an attempt starting now begins in it."""
    try:
        return os.path.getsize(Path(run_dir) / node.EVENTS)
    except OSError:
        return 0


def _records(run_dir: Path, since: int) -> list[dict[str, Any]]:
    try:
        with open(run_dir / node.EVENTS, "rb") as fh:
            fh.seek(since)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _data(rec: dict[str, Any]) -> dict[str, Any]:
    data = rec.get("data")
    return data if isinstance(data, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Attempt:
    """What one attempt recorded: whether its program is protected (a ``RunStarted`` of the
    runtime), how it said it ended (``RunExited``: its reason, line, step and the step of the
    checkpoint it sealed on stopping), the newest step of the run logged (`node.last_step`) and
    the newest checkpoint saved in the whole run (the step a restart resumes from)."""

    protected: bool = False
    exit_reason: str | None = None
    line: str = ""
    sealed_step: int | None = None
    last_step: int = 0
    saved_step: int = 0

    @classmethod
    def read(cls, run_dir: str | os.PathLike[str], since: int = 0) -> Attempt:
        """The attempt that began at byte `since` of the run's ``events.jsonl``."""
        path = Path(run_dir)
        protected, reason, line, sealed = False, None, "", None
        for rec in _records(path, since):
            if rec.get("source") != "run":
                continue
            data = _data(rec)
            if rec.get("reason") == RUN_STARTED:
                protected = True
            elif rec.get("reason") == RUN_EXITED:
                reason = str(data.get("exit_reason") or "")
                reason = reason or ("finished" if data.get("exit_code") == 0 else "")
                line = str(rec.get("message") or "")
                sealed = _int(data.get("checkpoint_step")) if reason in SEALED_STOPS else None
        saved = 0
        for rec in _records(path, 0):
            data = _data(rec)
            if rec.get("reason") == CHECKPOINT_SAVED and (step := _int(data.get("step"))):
                saved = max(saved, step)
        return cls(protected, reason, line, sealed, node.last_step(path), saved)


@dataclass(frozen=True)
class Verdict:
    """How an attempt ended: its `kind`, the exit code that stands for it (75 for a preemption,
    whatever the launcher said), the line the cockpit shows, and the steps it lost."""

    kind: Kind
    code: int
    line: str
    steps_lost: int = 0
    #: the step of the checkpoint the attempt sealed on stopping, when it recorded one
    sealed: int | None = None


def unsaved_line(step: int, lost: int) -> str:
    return f"stopped without a checkpoint at step {step}: {lost} steps lost"


def classify(
    code: int,
    attempt: Attempt,
    resume_codes: tuple[int, ...] = (int(Exit.PREEMPTED),),
    *,
    signalled: bool = False,
    lost: bool = False,
) -> Verdict:
    """The verdict on an attempt that exited with `code`, by its record first (the rules in the
    module docstring). `signalled`: tgnb sent it SIGTERM or a drain notice; `lost`: its node went
    away (killed with no notice, or at the end of the drain window)."""
    preempted = int(Exit.PREEMPTED)
    if attempt.exit_reason in SEALED_STOPS and attempt.sealed_step is not None:
        sealed = attempt.sealed_step
        return Verdict("preempted", preempted, f"sealed checkpoint at step {sealed}", 0, sealed)
    ended = attempt.exit_reason in ("finished", "failed")
    found = attempt.exit_reason == UNSAVED  # so the node's launcher found it (`node_unsaved`)
    step = attempt.last_step
    steps_lost = max(0, step - attempt.saved_step)
    stopped = signalled and not lost and not ended and code not in resume_codes
    if found or (stopped and (code == 0 or steps_lost > 0)):  # a kill in setup loses nothing
        return Verdict("unsaved", preempted, unsaved_line(step, steps_lost), steps_lost)
    if code == 0:
        return Verdict("succeeded", 0, "finished")
    if code in resume_codes or signalled or lost:
        return Verdict("preempted", code if code in resume_codes else preempted, f"exit {code}")
    line = attempt.line if attempt.exit_reason == "failed" else ""
    return Verdict("failed", code, line or f"exit code {code}")


#: Error lines a restart repeats the same way (the node lacks what the program needs): a module
#: not installed (a lazy ``import``), CUDA absent (``.cuda()`` on a node with no GPU or driver).
#: Not CUDA's out-of-memory or a lost device: those may pass at the next attempt.
REPEATING = re.compile(
    r"^ModuleNotFoundError: No module named "
    r"|^AssertionError: Torch not compiled with CUDA enabled"
    r"|^RuntimeError: (?:Found no NVIDIA driver on your system|No CUDA GPUs are available)"
)


def repeats(error: BaseException | str) -> bool:
    """Whether a failure (an exception, or its line ``ModuleNotFoundError: No module named
    'x'``) would repeat at every restart (`REPEATING`): the node then exits `Exit.REPEATS`, final
    on every engine (`tgnb.runs.recovery.FINAL_CODES`)."""
    if isinstance(error, BaseException):
        first = str(error).splitlines()[0] if str(error) else ""
        error = f"{type(error).__name__}: {first}"
    return bool(REPEATING.match(error.strip()))


#: Exceptions a launcher raises for its child's failure (torchrun, ``accelerate launch``): the
#: child's own traceback, printed before, says what failed.
LAUNCHER_ERRORS = ("ChildFailedError", "CalledProcessError")
_RANK_PREFIX = re.compile(r"^\[(?:default)?(?:rank)?\d+\]:\s?")


def failure_line(stderr: str) -> str | None:
    """The exception line (``ModuleNotFoundError: No module named 'x'``) of the last traceback a
    program printed in `stderr` (its tail), passing over a launcher's own for its child's failure
    (`LAUNCHER_ERRORS`); None when it printed no traceback."""
    lines = [_RANK_PREFIX.sub("", line) for line in stderr.splitlines()]
    found: list[str] = []
    inside = False
    for line in lines:
        if line.startswith("Traceback (most recent call last):"):
            inside = True
        elif inside and line.strip() and not line[:1].isspace():
            found.append(line.strip())
            inside = False
    while found and found[-1].split(":")[0].rsplit(".", 1)[-1] in LAUNCHER_ERRORS:
        found.pop()
    return found[-1] if found else None


def repeat_fix(line: str) -> str:
    """The fix of a failure line that repeats (`repeats`), in words."""
    if line.startswith("ModuleNotFoundError"):
        named = re.search(r"No module named '([^']+)'", line)
        return (
            f"install {named.group(1) if named else 'the module'} where the run runs (its image or "
            "environment), or ship it in the workdir; not restarted"
        )
    return (
        "run it on GPU nodes, or fall back to the CPU where torch.cuda.is_available() is False; "
        "not restarted"
    )


def node_unsaved(run_dir: str | os.PathLike[str] | None, code: int, since: int) -> Verdict | None:
    """For a node's launcher that tgnb's SIGTERM reached (torchrun's agent): the verdict when the
    attempt that began at byte `since` stopped with nothing sealed (rule 2), else None. The
    launcher then records it (a ``RunExited`` whose ``exit_reason`` is `UNSAVED`) and exits 75,
    so every engine restarts the run uncounted and the cockpit says what was lost."""
    if run_dir is None:
        return None
    verdict = classify(code, Attempt.read(run_dir, since), signalled=True)
    return verdict if verdict.kind == "unsaved" else None


def node_exit(run_dir: str | os.PathLike[str] | None, code: int, since: int) -> int:
    """The exit code a node's process leaves with: `code`, or `Exit.PREEMPTED` when the attempt
    that began at byte `since` of the run's events recorded a sealed preemption checkpoint (a
    launcher's 1 or 143 then). The same rule as `classify`, for the engines that read exit codes."""
    if code == 0 or code == int(Exit.PREEMPTED) or run_dir is None:
        return code
    verdict = classify(code, Attempt.read(run_dir, since))
    return verdict.code if verdict.kind == "preempted" else code


def failed_detail(code: int, verdict: Verdict | None) -> str:
    """A failed run's status detail: its exit code, and for a failure every start would repeat
    (`Exit.REPEATS`) the line it fails with."""
    if code == int(Exit.REPEATS) and verdict is not None:
        return f"{verdict.line} (exit code {code}: it fails the same way at every start)"
    return f"exit code {code}"


def requeued(
    verdict: Verdict | None, node_name: str | None, slurm: bool, moving: bool
) -> tuple[str, dict[str, Any]]:
    """How a start that ended with a preemption (or a move) is told: the ``RunRequeued`` line
    and its data. Stopped by the signal with nothing sealed: the steps it lost; `moving` (the
    engine stopped it on purpose to go back to preemptible nodes): the move; a sealed
    checkpoint: its step, whatever a launcher exited with."""
    what = f"{'requeued' if slurm else 'pod recreated'} after {node_name} was preempted"
    if verdict is not None and verdict.kind == "unsaved":
        return verdict.line, {"unsaved": True, "steps_lost": verdict.steps_lost}
    if moving:
        return f"moved back to preemptible nodes from {node_name}", {"moved": True}
    if verdict is not None and verdict.sealed is not None:
        return f"{what}: {verdict.line}", {"sealed_step": verdict.sealed}
    return what, {}
