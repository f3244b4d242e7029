"""Slurm's one-line records (``scontrol show job -o``, ``scontrol show node -o``) read into
tgnb's terms: the fields of a record, and a job's `JobStatus`."""

from __future__ import annotations

import re
from collections.abc import Mapping

from tgnb.backends.base import JobState, JobStatus

_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9/:_]*)=")

#: Slurm job states (``JobState=`` of ``scontrol show job``, ``State`` of ``sacct``) to ours.
STATE_MAP: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.PENDING,
    "STOPPED": JobState.PENDING,
    "REQUEUED": JobState.REQUEUED,
    "REQUEUE_FED": JobState.REQUEUED,
    "REQUEUE_HOLD": JobState.REQUEUED,
    "PREEMPTED": JobState.REQUEUED,
    "COMPLETED": JobState.SUCCEEDED,
    "CANCELLED": JobState.CANCELLED,
    "FAILED": JobState.FAILED,
    "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED,
    "BOOT_FAIL": JobState.FAILED,
    "DEADLINE": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "REVOKED": JobState.CANCELLED,
}


def parse_fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of a one-line ``scontrol show ... -o`` record (values may hold spaces)."""
    matches = list(_FIELD.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


def job_status(fields: Mapping[str, str]) -> JobStatus:
    """Our `JobStatus` of one ``scontrol show job`` record.

    A PENDING job that has restarted before is REQUEUED: it was preempted (or drained and requeued)
    and will run again; so is one still COMPLETING right after its requeue (no ``EndTime`` yet). ``Reason=`` and the Slurm state go into `detail`.
    """
    raw = fields.get("JobState", "")
    slurm_state = raw.split("+")[0].upper()
    restarts = int(fields.get("Restarts", "0") or 0)
    state = STATE_MAP.get(slurm_state, JobState.UNKNOWN)
    if state is JobState.PENDING and restarts > 0:
        state = JobState.REQUEUED
    # Just after a requeue the job shows COMPLETING (its processes are being stopped) with no end
    # time, where a job that really completes has one.
    if (
        slurm_state == "COMPLETING"
        and restarts > 0
        and fields.get("EndTime") in ("Unknown", "None")
    ):
        state = JobState.REQUEUED
    exit_code = None
    if state.finished and ":" in fields.get("ExitCode", ""):
        code, _, sig = fields["ExitCode"].partition(":")
        exit_code = int(code) if code.isdigit() and sig in ("0", "") else 128 + int(sig or 0)
    nodelist = fields.get("NodeList", "")
    nodes = tuple(n for n in nodelist.split(",") if n and n != "(null)")
    reason = fields.get("Reason", "")
    detail = slurm_state if reason in ("", "None") else f"{slurm_state} ({reason})"
    return JobStatus(state, restarts, nodes, exit_code, detail)
