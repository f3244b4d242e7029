"""A cluster whose events cannot be read is an error, not an empty timeline: `Run.events()` raises
the cluster's typed `ApiError` as `Session.events()` does (issue 25: "backend errors are raised or
reported, never swallowed"), and ``cluster=False`` still reads the run's own events. The real
emulator daemon answers every API request 503 (its chaos knob) after a real stand-in run."""

from __future__ import annotations

import pytest

from tgnb.emulator.testing import EmulatorHandle
from tgnb.errors import ApiError
from tgnb.events import RUN_EXITED
from tgnb.session import Session

pytestmark = pytest.mark.usefixtures("standin")


def test_unreadable_cluster_events_are_raised_not_dropped(
    emu: EmulatorHandle, session: Session
) -> None:
    run = session.launch("grpo", name="ev", max_steps=3, env={"STANDIN_STEP_SECONDS": "0.05"})
    assert run.wait(timeout=120, progress=False).state.value == "succeeded"
    assert any(e.source == "cluster" for e in run.events())  # the node events are merged in
    emu.set_chaos(1.0, kinds=("503",))
    try:
        with pytest.raises(ApiError):
            run.events()
        with pytest.raises(ApiError):
            session.events()
        own = run.events(cluster=False)
    finally:
        emu.set_chaos(0.0)
    assert own and own[-1].reason == "JobReleased"  # the engine's release closes the run's record
    assert [e for e in own if e.source == "run"][-1].reason == RUN_EXITED
    assert all(e.source != "cluster" for e in own)
