"""A run as TorchFT replica groups on the real Slurm of `.ci/slurm-up` (issue 50), end to end:
`SlurmBackend` submits the lighthouse's job to the ``standard`` partition (its node carries no
``preemptible`` feature) and the two groups as an array on the preemptible node, each running the
plain TorchFT program of `tests/backends/ft_workdir/train_ft.py` (Manager, Optimizer,
ProcessGroupGloo, nothing of tgnb). One group is preempted the way Slurm does it, ``scontrol
requeue ARRAY_TASK``: its job is killed and queued again while the other group trains on alone,
never restarted; the requeued group comes back, heals from its peer (it enters at the peer's step:
the program has no checkpoint), and the run ends with every step trained once."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, Resources, RunSpec
from tgnb.backends.slurm import SlurmBackend, groups
from tgnb.backends.slurm.records import parse_fields
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.trainconfig import from_dict

from .conftest import NODE, STANDARD_NODE

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.training]
pytest.importorskip("torchft")
FT_WORKDIR = Path(__file__).parents[1] / "ft_workdir"
#: a cap: the test ends the run through the program's ``FT_UNTIL`` file once the requeued group
#: is back in the quorum (Slurm holds a requeued job about ten seconds, then torchrun and torch's
#: import: it was back within 65 s under load)
ENV = {"FT_STEPS": "100000", "FT_STEP_S": "0.05"}
PREEMPTED, SURVIVOR = 1, 0


#: one of the program's lines: a flat JSON object (another process's output may share its line)
LINE = re.compile(r'\{"group": [^{}]*\}')


def lines(run_dir: Path, job: str, group: int) -> list[dict[str, Any]]:
    """The program's own lines (one JSON object per step) in group `group`'s log."""
    path = run_dir / f"slurm-{job}_{group}.out"
    out = []
    for found in LINE.finditer(path.read_text(errors="replace") if path.exists() else ""):
        with contextlib.suppress(ValueError):  # a line cut short by the kill
            out.append(json.loads(found.group()))
    return out


def show(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    return parse_fields(out.stdout)


def test_a_requeued_group_heals_from_its_peer_which_trains_on(
    slurm: str, tmp_path: Path, cleanup_jobs: list[str]
) -> None:
    standard = subprocess.run(
        ["sinfo", "-h", "-p", "standard", "-o", "%N"], capture_output=True, text=True
    ).stdout.strip()
    assert standard == STANDARD_NODE, (
        f"no standard partition here ({standard!r}): bash .ci/slurm-up"
    )
    backend = SlurmBackend(
        runs_root=tmp_path / "runs", gres=False, poll_seconds=1.0, lighthouse_partition="standard"
    )
    spec = RunSpec(
        name="ft-requeue",
        train=from_dict(
            {"name": "ft-requeue", "script": "train_ft.py", "fault_tolerance": "torchft"}
        ),
        resources=Resources(nodes=2, gpus_per_node=0),
        workdir=str(FT_WORKDIR),
        env={**ENV, "FT_UNTIL": str(tmp_path / "until")},
        recovery=RecoveryPolicy(max_restarts=0),  # a failure would end the run: none may happen
    )
    job = backend.submit(spec)
    run_dir = Path(backend.run_dir(job))
    house = (run_dir / groups.LIGHTHOUSE_JOB_FILE).read_text().strip()
    cleanup_jobs += [job, house]

    def training_together() -> bool:  # each group has trained 10 steps with its peer
        return all(
            sum(s.get("participants") == 2 for s in lines(run_dir, job, g)) >= 10 for g in (0, 1)
        )

    wait_until(training_together, 300, what="both groups training in one quorum", every=0.5)
    assert show(house)["NodeList"] == STANDARD_NODE  # the lighthouse: off the preemptible node
    assert {show(f"{job}_{g}")["NodeList"] for g in (0, 1)} == {NODE}
    before = max(s.get("step", 0) for s in lines(run_dir, job, SURVIVOR))

    subprocess.run(["scontrol", "requeue", f"{job}_{PREEMPTED}"], check=True, timeout=30)
    wait_until(  # the survivor trains on alone, at steps past the preemption
        lambda: any(
            s.get("step", 0) > before and s["participants"] == 1
            for s in lines(run_dir, job, SURVIVOR)
        ),
        120,
        what="the survivor training alone",
        every=0.5,
    )

    def back_together() -> bool:  # the requeued group's second start trains with its peer
        mine = lines(run_dir, job, PREEMPTED)
        starts = [i for i, s in enumerate(mine) if "started" in s]
        return len(starts) == 2 and any(s.get("participants") == 2 for s in mine[starts[1] :])

    wait_until(back_together, 300, what="the requeued group back in the quorum", every=0.5)
    # the groups stop 20 steps past the furthest step so far (the file written whole at once)
    last = max(s.get("step", 0) for s in lines(run_dir, job, SURVIVOR)) + 20
    (tmp_path / "until.part").write_text(str(last), encoding="utf-8")
    (tmp_path / "until.part").replace(tmp_path / "until")
    final = backend.wait(job, timeout=600)
    log = "\n".join(backend.logs(job))
    assert final.state is JobState.SUCCEEDED, (final, log[-2000:])
    assert final.restart_count == 1, final  # the preempted group's requeue, and no other
    assert show(f"{job}_{SURVIVOR}")["Restarts"] == "0"
    assert show(f"{job}_{PREEMPTED}")["Restarts"] == "1"

    theirs = lines(run_dir, job, SURVIVOR)
    assert sum("started" in s for s in theirs) == 1  # never restarted
    survivor = [s["step"] for s in theirs if "step" in s]
    assert survivor == sorted(survivor), survivor  # never went back
    # every step trained once: each committed step follows the last one (a step the quorum did
    # not commit, as the peer went away mid-step, is printed again with the same number)
    # (the survivor may itself have started behind its peer and healed at its first step)
    assert sorted(set(survivor)) == list(range(survivor[0], last + 1)), survivor
    trained = {s["step"] for g in (0, 1) for s in lines(run_dir, job, g) if "step" in s}
    assert trained == set(range(1, last + 1)), sorted(trained)  # the run's steps, each once
    assert theirs[-1]["done"] == last

    mine = lines(run_dir, job, PREEMPTED)
    starts = [i for i, s in enumerate(mine) if "started" in s]
    assert len(starts) == 2, starts  # the first start and the requeued one
    first = [s["step"] for s in mine[: starts[1]] if "step" in s]
    again = [s for s in mine[starts[1] :] if "step" in s]
    # healed from its peer: the requeued group's first step follows the survivor's, beyond
    # where it had left (no checkpoint: the state came from the survivor, live)
    assert again[0]["step"] > first[-1] >= 10, (first[-3:], again[:3])
    assert again[0]["step"] > before, (before, again[:3])
    assert any(s["participants"] == 2 for s in again)  # back in the quorum with its peer
    assert mine[-1]["done"] == last
    requeued_log = (run_dir / f"slurm-{job}_{PREEMPTED}.out").read_text()
    assert "requeued (restart 1)" in requeued_log

    # the lighthouse's job ends with the groups' array, and removes its address
    wait_until(
        lambda: backend.status(house).state.finished, 120, what="the lighthouse to end", every=1
    )
    assert not (run_dir / groups.ADDRESS_FILE).exists()
