"""`Backend`: what the run store's `Run` and `Session` need from a workload engine.

Declared here, beside the domain types, so that `tgnb.runs` depends on no engine; the engines in
`tgnb.backends` implement it (``tgnb.backends.Backend`` is this protocol).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from tgnb.events import Event
from tgnb.runs.spec import JobStatus, RunSpec


@runtime_checkable
class Backend(Protocol):
    """What tgnb needs from an engine: everything `Session` and `Run` call, nothing found by
    probing. Job ids are strings chosen by the engine."""

    name: str
    #: True when the engine's own process writes the run's state into the run store as it changes
    #: (the local backend's supervisor); False when the engine holds the truth and `Run` copies
    #: what `status` says into the store (Slurm, Kubernetes).
    records_state: bool

    def preflight(self, spec: RunSpec) -> object:
        """Every check `submit` makes before it changes anything (engine commands present,
        controller reachable, image given); raises a `tgnb.errors.TgnbError`. `Session.launch`
        calls it before recording the run, so bad input leaves no trace. Any result is the
        engine's own."""
        ...

    def run_dir_for(self, name: str) -> str | os.PathLike[str] | None:
        """Where the run named `name` keeps its checkpoints, metrics and events by default;
        None when that is not a path this machine chooses (a pod's volume)."""
        ...

    def submit(self, spec: RunSpec) -> str: ...

    def status(self, job_id: str) -> JobStatus: ...

    def cancel(self, job_id: str) -> None: ...

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]: ...

    def events(self, job_id: str) -> list[Event]: ...

    def restart_count(self, job_id: str) -> int: ...

    def recover(self, job_id: str) -> bool:
        """Start again what keeps an unfinished run going when it is gone (after a machine
        restart); False when nothing was needed or the engine does that itself."""
        ...
