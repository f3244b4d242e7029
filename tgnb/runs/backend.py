"""`Backend`: what the run store's `Run` and `Session` need from a workload engine.

One skeleton for every engine (as submitit's Executor): `Backend.preflight` renders the launch and
checks it, `Backend.submit` sends what was rendered (rendered once per launch); while the run
lives, the engine's end of the one placement loop (`tgnb.runs.placing`) places it.

Declared here, beside the domain types, so that `tgnb.runs` depends on no engine; the engines in
`tgnb.backends` implement it (``tgnb.backends.Backend`` is this protocol).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from tgnb.runs.spec import JobStatus, RunSpec


@runtime_checkable
class Backend(Protocol):
    """What tgnb needs from an engine: what `Session` and `Run` call, and nothing else (an
    engine's own methods, its ``events`` and ``restart_count``, are its own). Job ids are strings
    chosen by the engine.

    One mode for every engine: `status` answers from the engine (slurmctld, the Kubernetes Job, the
    local supervisor's records in the run store) and is the truth; the session records each run
    and its job in the run store once (`Session.launch`), and the store follows `status` only where
    `Run.sync` is called (`Run.wait` does, at each poll). A backend never creates a run's record.
    Errors are raised, typed: a `tgnb.errors.TgnbError` (`BackendError` for an engine's failure).
    """

    name: str

    def preflight(self, spec: RunSpec) -> Any:
        """Render the launch (the engine's own: an sbatch script, the Kubernetes objects) and make
        every check `submit` would make before it changes anything (engine commands present,
        controller reachable, image given); raises a `tgnb.errors.TgnbError`. `Session.launch`
        calls it before recording the run, so bad input leaves no trace, and hands what it
        returns to `submit`."""
        ...

    def run_dir_for(self, name: str) -> str | os.PathLike[str] | None:
        """Where the run named `name` keeps its checkpoints, metrics and events by default;
        None when that is not a path this machine chooses (a pod's volume)."""
        ...

    def submit(self, spec: RunSpec, prepared: Any = None) -> str:
        """Start the run the session has just recorded under `spec.name`, sending what
        `preflight` rendered (`prepared`; rendered and checked afresh when None); the job id."""
        ...

    def status(self, job_id: str) -> JobStatus:
        """The job's status, from the engine; raises when the engine cannot say."""
        ...

    def cancel(self, job_id: str) -> None: ...

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """The job's output, raw lines without newline (``@tgnb`` records included: `Run`
        parses them); with `follow`, as they are written until the job has finished."""
        ...

    def recover(self, job_id: str) -> bool:
        """Start again what keeps an unfinished run going when it is gone (after a machine
        restart); False when nothing was needed or the engine does that itself."""
        ...
