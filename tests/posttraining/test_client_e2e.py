"""The Post-Training Python API end to end against a real emulator daemon over loopback HTTP, with
the unmodified SDK underneath and real torch/peft computation on the built-in tiny model: start a
resource, two LoRA sessions, a few forward-backward/optim steps each, client metrics, checkpoints,
an adapter download, the cost, a refused then forced stop; and bad input refused with nothing sent
(checked in the emulator's request log)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tgnb
from tests.conftest import wait_until
from tgnb import events as ev
from tgnb.emulator.testing import EmulatorHandle
from tgnb.errors import ApiError, ValidationError

MODEL = "tgnb/tiny-llama"  # the alias a user types; the listing names its directory (LISTED)


@pytest.fixture
def emu(rl_emulator: EmulatorHandle) -> EmulatorHandle:
    """B's shared daemon (tests/emulator/rl/conftest.py), the SDK's variables set."""
    return rl_emulator


def _sample(offset: int) -> Any:
    from together.post_training import Sample

    toks = [5 + (offset + i) % 20 for i in range(12)]
    return Sample(
        model_input={"chunks": [{"encoded_text": {"tokens": toks[:-1]}}]},
        loss_fn_inputs={"target_tokens": toks[1:], "weights": [1.0] * 11},
    )


def tiny_listed() -> str:
    """The name `/v1/rl/supported-models` gives the built-in model: its directory."""
    from tgnb.emulator.rl.catalog import materialize_tiny

    return str(materialize_tiny())


def _posts(emu: EmulatorHandle) -> list[str]:
    return [r["path"] for r in emu.requests() if r["method"] != "GET"]


def _refused_creates(emu: EmulatorHandle) -> list[int]:
    """The statuses the service answered the session creates sent since the log was cleared."""
    return [
        int(r["status"])
        for r in emu.requests()
        if r["method"] == "POST" and r["path"].endswith("/training-sessions")
    ]


@pytest.mark.slow
def test_resource_sessions_checkpoints_cost_and_stop(emu: EmulatorHandle, tmp_path: Path) -> None:
    from together.post_training import AdamParams

    pt = tgnb.post_training(local=True, home=emu.home)
    assert pt.conn.emulator is not None and pt.base_url == emu.base_url
    assert tiny_listed() in [m.name for m in pt.models()]

    res = pt.start(MODEL, generators=1, inactive_timeout=900)
    assert res.info().status == "READY"
    assert res.id in [r.id for r in pt.resources()]

    sessions = [
        res.open_session(lora={"rank": 4, "alpha": 8}, name="r4"),
        res.open_session(lora={"rank": 8, "alpha": 16}, name="r8"),
    ]
    assert [(s.name, s.lora_rank, s.status) for s in res.sessions()] == [
        ("r4", 4, "RUNNING"),
        ("r8", 8, "RUNNING"),
    ]
    losses: dict[str, list[float]] = {}
    for sess in sessions:
        for k in range(3):
            fb = sess.trainer.forward_backward(samples=[_sample(k)], loss={"type": "cross_entropy"})
            losses.setdefault(sess.id, []).append(fb.loss)
            sess.trainer.optim_step(adam_params=AdamParams(learning_rate=5e-2))
            sess.record(reward_mean=0.1 * (k + 1))
        assert sess.trainer.weights_sync().weights_version is not None
        # the SDK's own objects, recorded on the side
        from together.post_training import Generator, Trainer

        assert isinstance(sess.trainer, Trainer) and isinstance(sess.generator, Generator)
        out = sess.generator.sample(
            {"chunks": [{"encoded_text": {"tokens": [5, 6, 7]}}]},
            num_samples=1,
            sampling_params={"max_tokens": 4, "temperature": 1.0},
        )
        assert out.sequences

    for sess in sessions:
        assert [y for _, y in sess.log.series("loss")] == losses[sess.id]  # the SDK's answers
        assert [x for x, _ in sess.log.series("loss")] == [0.0, 1.0, 2.0]
        assert [y for _, y in sess.log.series("reward_mean")] == pytest.approx([0.1, 0.2, 0.3])
        assert sess.step == 3 and sess.info().step == 3
        assert sess.info().policy_version >= 1
        assert sess.log.operations() >= 8  # 3 x (fwd-bwd + optim) + weights-sync + sample

    ck = sessions[0].save("inference")
    tck = sessions[1].save("training")
    assert (ck.kind, ck.step, tck.kind) == ("inference", 3, "training")
    listed = {c.id: c for c in res.checkpoints()}
    assert {ck.id, tck.id} <= set(listed)
    files = sessions[0].download(variant="adapter", out=tmp_path / "adapter")
    names = sorted(p.name for p in files)
    assert "adapter_config.json" in names and all(p.stat().st_size > 0 for p in files)
    assert [p.name for p in pt.download(ck.id, "adapter", tmp_path / "again")] == [
        p.name for p in files
    ]

    cost = res.cost()
    usage = res.usage()
    assert usage is not None and not cost.estimated
    assert usage["gpu_minutes"] == pytest.approx(emu.rl_usage(res.id)["gpu_minutes"], rel=0.5)
    assert cost.gpu_minutes > 0 and cost.amount > 0
    assert cost.amount == pytest.approx(usage["cost"], rel=0.2)  # price x minutes, a bit later
    # dollars per session: the resource's split between its two sessions, all of it
    assert [label for label, _ in cost.sessions] == ["r4", "r8"]
    assert sum(usd for _, usd in cost.sessions) == pytest.approx(cost.amount)
    assert "per session: r4 $" in str(cost)

    # The panel shows both sessions, their curves and the cost (static HTML, no kernel).
    panel = tgnb.panel(res, start=False)  # drawn once, no polling thread
    assert not panel._poller.running
    page = panel.to_html()
    assert "r4" in page and "r8" in page and page.count('class="series"') == 4
    assert "GPU-min" in page
    panel.close()
    live = tgnb.panel(res, poll_interval=0.2)  # polls on a thread until the resource stops
    assert live._poller.running and "r8" in live.table.value

    # Stop is refused while sessions run (the server's 400), nothing changes; force stops all.
    with pytest.raises(ApiError, match=r"2 active session\(s\) \(r4, r8\).*force=True"):
        res.stop()
    assert res.info().status == "READY"
    assert [s.status for s in res.sessions()] == ["RUNNING", "RUNNING"]
    assert sessions[1].stop().status == "STOPPED"
    assert res.stop(force=True).status in ("STOPPING", "STOPPED")
    assert {s.status for s in res.sessions()} <= {"STOPPED", "STOPPING"}
    final = res.cost()
    assert final.stopped_at is not None
    wait_until(lambda: not live._poller.running, timeout=30)
    assert live.finished and "STOPP" in live.header.value
    live.close()

    reasons = [e.reason for e in res.events()]
    for reason in (
        ev.RESOURCE_CREATED,
        ev.RESOURCE_READY,
        ev.SESSION_STARTED,
        ev.SESSION_CHECKPOINT,
        ev.SESSION_STOPPED,
        ev.RESOURCE_STOPPED,
    ):
        assert reason in reasons, reason
    assert tgnb.timeline(res).lanes[0].kind == "resource"


@pytest.mark.slow
def test_bad_input_is_refused_before_anything_is_sent(emu: EmulatorHandle) -> None:
    pt = tgnb.post_training(local=True, home=emu.home)
    res = pt.start(MODEL, generators=0, inactive_timeout=300)
    emu.clear_requests()
    bad: list[Any] = [
        lambda: pt.start(MODEL, generators=-1),
        lambda: pt.start("", generators=1),
        lambda: pt.start(MODEL, inactive_timeout=5),
        lambda: res.open_session(lora={"rnak": 8}),
        lambda: res.open_session(lora={"rank": 8, "alpha": "16"}),
        lambda: res.open_session(name="two words"),
        lambda: pt.download("ck-1", variant="lora"),
        lambda: pt.attach("../etc"),
        lambda: res.extend(5),
    ]
    for call in bad:
        with pytest.raises(ValidationError):
            call()
    # nothing sent but reads
    assert [r for r in emu.requests() if r["method"] != "GET"] == []
    # The model's rank range is the service's rule: its refusal (400) reaches the user as the
    # same one-line fix, and nothing is opened.
    with pytest.raises(ValidationError, match=r"^LoRA rank 0 is out of range: use 1 to 64 \("):
        res.open_session(lora={"rank": 0})
    assert _refused_creates(emu) == [400] and res.sessions() == []

    # A generator-less resource's session says how to get one; a sixth LoRA session is the
    # service's to refuse (429, after the SDK's retries): the user reads which sessions hold the
    # resource and the fix, and no sixth is opened. An alpha is a float too, as the service takes.
    sessions = [res.open_session(lora={"rank": 2, "alpha": 2.5}, name=f"s{i}") for i in range(5)]
    assert {s.lora_alpha for s in res.sessions()} == {2.5}
    with pytest.raises(ValidationError, match="no generator"):
        sessions[0].generator  # noqa: B018
    emu.clear_requests()
    with pytest.raises(
        ValidationError, match=r"already holds 5 session\(s\) \(s0, .*stop one first"
    ):
        res.open_session(lora={"rank": 2}, name="s5")
    assert set(_refused_creates(emu)) == {429}
    assert sorted(s.name for s in res.sessions()) == [f"s{i}" for i in range(5)]
    sessions[4].stop()
    assert res.open_session(lora={"rank": 2}, name="s5").name == "s5"
    assert res.stop(force=True).status in ("STOPPING", "STOPPED")

    # An unknown resource is a NotFoundError naming what lists them; the key is never shown.
    with pytest.raises(tgnb.NotFoundError, match=r"pt.resources\(\)") as info:
        pt.attach("no-such-resource")
    assert emu.api_key not in str(info.value)


@pytest.mark.slow
def test_native_clients_tracked_and_the_remote_mode(
    emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe written against the SDK's own clients gets the panel's curves through track();
    local=False reads TOGETHER_API_KEY / TOGETHER_BASE_URL as the SDK does (here: the emulator)."""
    from together.post_training import ModelResourcesClient

    for key, value in emu.env.items():
        monkeypatch.setenv(key, value)
    pt = tgnb.post_training(local=False)
    assert pt.conn.emulator is None and pt.base_url == emu.base_url
    with ModelResourcesClient.create(
        base_model=MODEL, compute_config={"num_generator_replicas": 0}, interval=0.2
    ) as mr:
        res = pt.track(mr)
        sess = pt.track(mr.create_session(lora_config={"rank": 2}, interval=0.2))
        fb = sess.trainer.forward_backward(samples=[_sample(0)], loss={"type": "cross_entropy"})
        sess.record(reward_mean=0.5)
        assert sess.log.series("loss") == [(0.0, fb.loss)]
        cost = res.cost()
        assert cost.estimated  # remote mode: no emulator usage report is asked for
        assert res.sessions()[0].id == sess.id
        # Idle expiry (the emulator's admin knob): the resource stops, its session EXPIRED, and
        # both show in the events.
        emu.rl_expire(res.id)
        assert res.info().status in ("STOPPING", "STOPPED")
        assert sess.info().status == "EXPIRED"
        reasons = {e.reason for e in res.events()}
        assert {ev.SESSION_EXPIRED, ev.RESOURCE_STOPPED} <= reasons
    with pytest.raises(ValidationError, match="track"):
        pt.track(object())
    monkeypatch.delenv("TOGETHER_API_KEY")
    with pytest.raises(tgnb.ConfigError, match="no TOGETHER_API_KEY"):
        tgnb.post_training(local=False)


def test_local_starts_the_emulator_when_none_runs(tmp_path: Path) -> None:
    from tgnb.emulator import daemon

    assert not daemon.status(tmp_path).running
    try:
        pt = tgnb.post_training(local=True, home=tmp_path)
        st = daemon.status(tmp_path)
        assert st.running and pt.base_url == st.base_url
        assert tiny_listed() in [m.name for m in pt.models()]
        # a second handle reuses the running daemon
        assert tgnb.post_training(local=True, home=tmp_path).base_url == pt.base_url
    finally:
        daemon.stop(tmp_path)


@pytest.mark.slow
def test_server_refusals_and_a_wrong_key_read_as_one_line(
    emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What only the server can check (an unknown model) comes back as an ApiError quoting the
    server's reason; a rank above the model's own LoRA rank limit is the service's to refuse, and
    its refusal names the limit the model list shows, nothing opened; a wrong key is an AuthenticationError that never shows the key."""
    pt = tgnb.post_training(local=True, home=emu.home)
    with pytest.raises(ApiError, match=r"refused to start a model resource.*\(400\)") as info:
        pt.start("no-such/model")
    assert "base_model" in str(info.value)
    res = pt.start(MODEL, generators=0)
    max_rank = next(m.max_lora_rank for m in pt.models() if m.name == tiny_listed())
    assert max_rank is not None
    with pytest.raises(ValidationError, match=f"use 1 to {max_rank} \\(this model's maximum\\)"):
        res.open_session(lora={"rank": max_rank + 1})
    assert res.sessions() == []  # nothing was opened
    res.stop()

    wrong = "tgnb-wrong-key-0123456789"
    monkeypatch.setenv("TOGETHER_API_KEY", wrong)
    monkeypatch.setenv("TOGETHER_BASE_URL", emu.base_url)
    with pytest.raises(tgnb.AuthenticationError, match="401") as auth:
        tgnb.post_training(local=False).models()
    assert wrong not in str(auth.value) and emu.api_key not in str(auth.value)
