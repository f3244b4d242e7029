"""Workload backends: one module per engine behind the `Backend` protocol in `tgnb.backends.base`."""

from tgnb.backends.base import Backend, JobState, JobStatus, Resources, RunSpec, SecretRef

__all__ = ["Backend", "JobState", "JobStatus", "Resources", "RunSpec", "SecretRef"]
