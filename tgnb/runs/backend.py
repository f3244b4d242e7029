"""`Backend`: what the run store's `Run` and `Session` need from a workload engine.

Declared here, beside the domain types, so that `tgnb.runs` depends on no engine; the engines in
`tgnb.backends` implement it (``tgnb.backends.Backend`` is this protocol).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from tgnb.events import Event
from tgnb.runs.spec import JobStatus, RunSpec


@runtime_checkable
class Backend(Protocol):
    """What tgnb needs from an engine. Job ids are strings chosen by the engine."""

    name: str

    def submit(self, spec: RunSpec) -> str: ...

    def status(self, job_id: str) -> JobStatus: ...

    def cancel(self, job_id: str) -> None: ...

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]: ...

    def events(self, job_id: str) -> list[Event]: ...

    def restart_count(self, job_id: str) -> int: ...
