"""Runs: the durable run store (sqlite under the tgnb home) and the `Run` object."""

from tgnb.runs.run import Run
from tgnb.runs.store import RunRecord, RunStore, StatusChange

__all__ = ["Run", "RunRecord", "RunStore", "StatusChange"]
