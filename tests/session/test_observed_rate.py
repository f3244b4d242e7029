"""`checkpoint.auto` at launch weighs the preemption rate the cluster observed, the setting being
the prior: a real emulator over HTTP, a real preemption in its ``node_lifecycle_events``, and the
config as the node would run it (``Session.launch(dry_run=True)``: checked by a real
``python -m tgnb.train --check``, nothing launched)."""

from __future__ import annotations

import yaml

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle
from tgnb.events import PREEMPTION_NOTIFIED
from tgnb.session import Session


def test_launch_puts_the_observed_rate_and_its_source_in_the_runs_config(
    session: Session, emu: EmulatorHandle
) -> None:
    cluster_id = session.cluster.id
    emu.preempt(cluster_id)
    wait_until(lambda: PREEMPTION_NOTIFIED in {e.reason for e in session.cluster.events()})
    text = session.launch(
        "grpo", max_steps=5, checkpoint={"auto": True, "preemptions_per_hour": 0.5}, dry_run=True
    )
    policy = yaml.safe_load(text)["checkpoint"]
    source = policy["preemptions_source"]
    assert source.startswith("checkpoint.auto weighs ")
    assert ": 1 over " in source  # one preemption seen
    assert "prior 0.5 as 1 node-hour" in source and "setting 0.5 per hour" in source
    assert 0.5 < policy["observed_preemptions_per_hour"] <= 1.5  # (0.5 + 1) / (1 + node-seconds)
    assert policy["preemptions_per_hour"] == 0.5  # the setting stays: the prior of a restart
    plain = session.launch("grpo", max_steps=5, checkpoint={"every_steps": 2}, dry_run=True)
    assert yaml.safe_load(plain)["checkpoint"]["preemptions_source"] is None  # auto off
