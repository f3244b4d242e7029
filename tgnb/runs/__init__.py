"""Runs: the domain types of a run (`tgnb.runs.spec`; its checkpoint policy and preemption
estimate, `tgnb.runs.policy`, below every plane that reads them), the `Backend` protocol engines
implement (`tgnb.runs.backend`), the durable run store (sqlite under the tgnb home) and the `Run`
object."""

from tgnb.runs.backend import Backend
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import EXIT_PREEMPTED, JobState, JobStatus, Resources, RunSpec, SecretRef
from tgnb.runs.store import RunRecord, RunStore, StatusChange

__all__ = [
    "EXIT_PREEMPTED",
    "Backend",
    "JobState",
    "JobStatus",
    "RecoveryPolicy",
    "Resources",
    "Run",
    "RunRecord",
    "RunSpec",
    "RunStore",
    "SecretRef",
    "StatusChange",
]
