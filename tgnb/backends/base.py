"""The one small protocol every workload backend implements, and what a run asks for.

A backend places ``python -m tgnb.train`` processes on nodes (emulated processes, Slurm jobs or
Kubernetes pods); it never schedules GPUs itself. The protocol and the domain types live below the
backends, in `tgnb.runs.backend` and `tgnb.runs.spec`; they are re-exported here, where engines
look for them (backends may import the run layer, never the reverse).
"""

from __future__ import annotations

from tgnb.runs.backend import Backend
from tgnb.runs.spec import EXIT_PREEMPTED, JobState, JobStatus, Resources, RunSpec, SecretRef

__all__ = [
    "EXIT_PREEMPTED",
    "Backend",
    "JobState",
    "JobStatus",
    "Resources",
    "RunSpec",
    "SecretRef",
]
