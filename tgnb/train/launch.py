"""``python -m tgnb.train.launch [torchrun options] -m tgnb.train CONFIG ...``: torchrun, with the
workers' exit codes kept.

torchrun reports any worker's non-zero exit as its own failure (exit 1), so a preempted multi-process
run would look failed to Slurm and Kubernetes. This runs torchrun's own ``torch.distributed.run``
in-process and maps its ``ChildFailedError``: when every worker that failed exited with the same
tgnb code -- `Exit.PREEMPTED` (75, preempted and checkpointed), `Exit.NO_SPACE` (74, disk full) or
`Exit.BAD_CONFIG` (2, refused before training) or `Exit.REPEATS` (78, a failure every start would
repeat), both final for every engine's recovery policy -- or was killed by the agent after one did (a negative code), the launcher exits with that code;
anything else stays a failure (1). The options are torchrun's, unchanged. When the attempt recorded
a sealed preemption checkpoint, the launcher exits 75 whatever torchrun said (its agent stopped by
the SIGTERM passed on to the workers: `tgnb.runs.outcome.node_exit`). When that SIGTERM stopped a
program that sealed nothing (it exited 0, or died of it), the launcher records so and exits 75: the
run is restarted uncounted on every engine, and the cockpit says "stopped without a checkpoint at
step N: K steps lost" (`tgnb.runs.outcome.node_unsaved`).

With a budget in the run file its workers are given (`tgnb.runs.runfile`; a job rendered before it:
`tgnb.runs.node.BUDGET_ENV`) the launcher holds it (`tgnb.train.budget.held`): at the budget it
sends itself the SIGTERM a preemption sends, the workers seal a checkpoint, and it exits
`Exit.STOPPED` (77), which no engine restarts; a run whose earlier attempts already spent it exits
77 before starting anything.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tgnb.runs.node import Exit
from tgnb.runs.outcome import UNSAVED, Verdict, events_size, node_exit, node_unsaved

KEPT = (int(Exit.PREEMPTED), int(Exit.NO_SPACE), int(Exit.BAD_CONFIG), int(Exit.REPEATS))


def exit_code(failures: Mapping[int, Any]) -> int:
    """The launcher's exit code for torchrun's failures ``{rank: ProcessFailure}``."""
    codes = {int(f.exitcode) for f in failures.values()}
    own = {c for c in codes if c > 0}
    if len(own) == 1 and own <= set(KEPT):
        return own.pop()
    return 1


def run_dir_of(argv: Sequence[str]) -> str | None:
    """The run directory the workers are given (``--run-dir DIR``), if any."""
    words = list(argv)
    return words[words.index("--run-dir") + 1] if "--run-dir" in words[:-1] else None


def record_unsaved(run_dir: str | None, verdict: Verdict) -> None:
    """The attempt's ``RunExited`` as `tgnb.runs.outcome` reads it, with the steps it lost."""
    from tgnb.events import RUN_EXITED
    from tgnb.runs import node
    from tgnb.train.record import Recorder

    assert run_dir is not None
    name = None
    try:
        from tgnb.tasks import config

        name = config.load(os.path.join(run_dir, node.CONFIG)).name
    except Exception:  # the folder's name then: a record without its run's name is still read
        pass
    recorder = Recorder(run_dir, name)
    recorder.event(RUN_EXITED, verdict.line, exit_reason=UNSAVED, steps_lost=verdict.steps_lost)
    recorder.close()
    print(f"tgnb.train.launch: {verdict.line}", file=sys.stderr)


def after_signal(run_dir: str | None, code: int, since: int) -> int:
    """The exit code of a node's launcher that tgnb's SIGTERM reached, its program having exited
    with `code`: 75 and the attempt recorded as unsaved when the program sealed nothing
    (`tgnb.runs.outcome.node_unsaved`), else `code`."""
    unsaved = node_unsaved(run_dir, code, since)
    if unsaved is None:
        return code
    record_unsaved(run_dir, unsaved)
    return unsaved.code


def run_file_of(argv: Sequence[str]) -> str | None:
    """The run file the workers are given (``-m tgnb.train RUN_FILE``), if they are given one."""
    from tgnb.runs.node import RUN_FILE

    words = list(argv)
    for i, word in enumerate(words[:-2]):
        if word == "-m" and words[i + 1] == "tgnb.train":
            path = words[i + 2]
            return path if os.path.basename(path) == RUN_FILE else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    from tgnb.errors import TrainConfigError
    from tgnb.runs.runfile import RunFile
    from tgnb.train.attempt import mark
    from tgnb.train.budget import held

    words = list(sys.argv[1:] if argv is None else argv)
    run_dir, path = run_dir_of(words), run_file_of(words)
    mark()  # the attempt's first line in the log; torchrun's workers print none
    try:
        budget = None if path is None else RunFile.load(path).budget()
    except TrainConfigError as exc:  # the workers would refuse it too: one line, before them
        print(f"tgnb.train.launch: {exc}", file=sys.stderr, flush=True)
        return int(Exit.BAD_CONFIG)
    return held(run_dir, lambda: torchrun(words, run_dir), budget)


def torchrun(words: Sequence[str], run_dir: str | None) -> int:
    """torchrun's ``run`` on `words`, in this process; the launcher's exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    since = events_size(run_dir) if run_dir else 0
    args = parse_args(list(words))
    try:
        run(args)
    except ChildFailedError as exc:
        code = node_exit(run_dir, exit_code(exc.failures), since)
        codes = {rank: f.exitcode for rank, f in exc.failures.items()}
        print(f"tgnb.train.launch: workers exited {codes}; exit {code}", file=sys.stderr)
        return code
    except SignalException as exc:  # torchrun's agent got the SIGTERM and stopped its workers
        code = after_signal(run_dir, node_exit(run_dir, 128 + int(exc.sigval), since), since)
        print(
            f"tgnb.train.launch: workers exited on {exc.sigval.name}; exit {code}", file=sys.stderr
        )
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
