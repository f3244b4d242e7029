"""``python -m tgnb.train.launch [torchrun options] -m tgnb.train CONFIG ...``: torchrun, with the
workers' exit codes kept.

torchrun reports any worker's non-zero exit as its own failure (exit 1), so a preempted multi-process
run would look failed to Slurm and Kubernetes. This runs torchrun's own ``torch.distributed.run``
in-process and maps its ``ChildFailedError``: when every worker that failed exited with the same
tgnb code -- `EXIT_PREEMPTED` (75, preempted and checkpointed), `EXIT_NO_SPACE` (74, disk full) or
`Exit.BAD_CONFIG` (2, refused before training: final for every engine's recovery policy) -- or was killed by the agent after one did (a negative code), the launcher exits with that code;
anything else stays a failure (1). The options are torchrun's, unchanged. When the attempt recorded
a sealed preemption checkpoint, the launcher exits 75 whatever torchrun said (its agent stopped by
the SIGTERM passed on to the workers: `tgnb.runs.outcome.node_exit`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from tgnb.runs.node import Exit
from tgnb.runs.outcome import events_size, node_exit
from tgnb.runs.spec import EXIT_PREEMPTED
from tgnb.train.saving import EXIT_NO_SPACE

KEPT = (EXIT_PREEMPTED, EXIT_NO_SPACE, int(Exit.BAD_CONFIG))


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


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    words = list(sys.argv[1:] if argv is None else argv)
    run_dir = run_dir_of(words)
    since = events_size(run_dir) if run_dir else 0
    args = parse_args(words)
    try:
        run(args)
    except ChildFailedError as exc:
        code = node_exit(run_dir, exit_code(exc.failures), since)
        codes = {rank: f.exitcode for rank, f in exc.failures.items()}
        print(f"tgnb.train.launch: workers exited {codes}; exit {code}", file=sys.stderr)
        return code
    except SignalException as exc:  # torchrun's agent got the SIGTERM and stopped its workers
        code = node_exit(run_dir, 128 + int(exc.sigval), since)
        print(
            f"tgnb.train.launch: workers exited on {exc.sigval.name}; exit {code}", file=sys.stderr
        )
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
