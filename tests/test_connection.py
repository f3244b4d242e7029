"""`tgnb.connection`: one default for `tgnb.attach` and `tgnb.post_training`, and the emulator's own
operations on one optional object. Against a real emulator daemon over HTTP; "Together" here is
that same daemon reached through ``TOGETHER_API_KEY`` / ``TOGETHER_BASE_URL``, as the SDK reads
them (the real service cannot be reached from the tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tgnb
from tgnb import connection
from tgnb.cloud import Cloud
from tgnb.config import Secret, Settings
from tgnb.emulator.testing import EmulatorHandle


@pytest.mark.parametrize(
    ("local", "key", "expected"),
    [(None, None, True), (None, "k", False), (True, "k", True), (False, None, False)],
)
def test_wants_local_the_key_decides_unless_told(
    local: bool | None, key: str | None, expected: bool
) -> None:
    settings = Settings(Secret(key) if key else None, None, None, Path("/nonexistent"))
    assert connection.wants_local(local, settings) is expected


def test_attach_and_post_training_share_one_default(
    emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With a key both go to Together (nothing local is started: `post_training()` went to the
    emulator before, whatever the key); without one both go to the local emulator; `local=False`
    without a key is a ConfigError from both."""
    monkeypatch.setenv("TOGETHER_DISABLE_VERSION_CHECK", "1")
    monkeypatch.setenv("TOGETHER_API_KEY", emulator.api_key)
    monkeypatch.setenv("TOGETHER_BASE_URL", emulator.base_url)
    elsewhere = tmp_path / "no-emulator-here"
    monkeypatch.setenv("TGNB_HOME", str(elsewhere))
    pt = tgnb.post_training()
    assert pt.conn.emulator is None and pt.base_url == emulator.base_url
    Cloud(Settings.from_env()).create("shared-default", cluster_type="KUBERNETES")
    session = tgnb.attach("shared-default")
    assert session.emulator is None and session.poll == connection.REMOTE_POLL
    assert not connection.running(elsewhere)  # a local choice would have started one there

    monkeypatch.delenv("TOGETHER_API_KEY")
    monkeypatch.delenv("TOGETHER_BASE_URL")
    monkeypatch.setenv("TGNB_HOME", str(emulator.home))
    pt = tgnb.post_training()
    assert pt.conn.emulator is not None and pt.base_url == emulator.base_url
    session = tgnb.attach()
    assert session.emulator is not None and session.cloud.base_url == emulator.base_url
    assert session.emulator.time_scale() == pytest.approx(0.01)
    for call in (lambda: tgnb.post_training(local=False), lambda: tgnb.attach(local=False)):
        with pytest.raises(tgnb.ConfigError, match="TOGETHER_API_KEY"):
            call()


def test_preempt_is_the_emulators_own(
    emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Together `Session.preempt` refuses before any request; on the emulator a refusal
    quotes the emulator and names the nodes to choose."""
    monkeypatch.setenv("TGNB_HOME", str(emulator.home))
    monkeypatch.delenv("TOGETHER_API_KEY", raising=False)
    session = tgnb.attach()
    with pytest.raises(tgnb.ValidationError, match="cannot preempt bogus: node 'bogus' not found"):
        session.preempt("bogus")
    remote = tgnb.Session(session.cloud, session.cluster)
    with pytest.raises(tgnb.ValidationError, match="works only on the local emulator"):
        remote.preempt()


def test_pt_connect_follows_the_same_default(
    emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ip: Any
) -> None:
    """`%tg pt connect` with no flag goes where `tgnb.post_training()` goes (the key decides; it
    forced the emulator before); ``--local`` / ``--remote`` say which."""
    monkeypatch.setenv("TOGETHER_DISABLE_VERSION_CHECK", "1")
    monkeypatch.setenv("TOGETHER_API_KEY", emulator.api_key)
    monkeypatch.setenv("TOGETHER_BASE_URL", emulator.base_url)
    elsewhere = tmp_path / "no-emulator-here"
    monkeypatch.setenv("TGNB_HOME", str(elsewhere))
    ip.run_line_magic("tg", "pt connect")
    state = ip.magics_manager.registry["Tg"].pt_state()
    assert state.pt.conn.emulator is None and state.pt.base_url == emulator.base_url
    assert not connection.running(elsewhere)
    monkeypatch.delenv("TOGETHER_API_KEY")
    monkeypatch.delenv("TOGETHER_BASE_URL")
    monkeypatch.setenv("TGNB_HOME", str(emulator.home))
    ip.run_line_magic("tg", "pt connect")
    assert state.pt.conn.emulator is not None


def test_the_exported_emulator_url_keeps_its_own_operations(
    emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``export TOGETHER_API_KEY=... TOGETHER_BASE_URL=...`` as `tgnb emulator start` says: the key
    picks the service at that URL, and since it is this home's emulator its own operations
    (preempt, usage) are there, as with ``local=True``."""
    monkeypatch.setenv("TOGETHER_DISABLE_VERSION_CHECK", "1")
    monkeypatch.setenv("TOGETHER_API_KEY", emulator.api_key)
    monkeypatch.setenv("TOGETHER_BASE_URL", emulator.base_url)
    monkeypatch.setenv("TGNB_HOME", str(emulator.home))
    end = connection.connect()
    assert end.emulator is not None and end.poll == connection.LOCAL_POLL
    assert tgnb.post_training().conn.emulator is not None


def test_sdk_keywords_resolve_as_the_sdk_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Tinker layer's `Endpoint` (`of_sdk_keywords`): what is given wins, None reads
    ``TOGETHER_API_KEY`` / ``TOGETHER_BASE_URL``; no key starts nothing and is refused at once,
    naming both ways to get one. Its client is made once and stays open for the next user."""
    monkeypatch.setenv("TOGETHER_DISABLE_VERSION_CHECK", "1")
    monkeypatch.setenv("TGNB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TOGETHER_API_KEY", "env-key")
    monkeypatch.setenv("TOGETHER_BASE_URL", "http://env.invalid")
    assert connection.of_sdk_keywords().native() == {
        "api_key": "env-key",
        "base_url": "http://env.invalid",
    }
    given = connection.of_sdk_keywords("given-key", "http://given.invalid")
    assert given.native() == {"api_key": "given-key", "base_url": "http://given.invalid"}
    assert given.emulator is None
    client = given.sdk()
    assert given.sdk() is client and not client.is_closed()
    assert str(client.base_url).startswith("http://given.invalid")

    monkeypatch.delenv("TOGETHER_API_KEY")
    monkeypatch.delenv("TOGETHER_BASE_URL")
    with pytest.raises(tgnb.ConfigError, match=r"TOGETHER_API_KEY.*`tgnb emulator start`"):
        connection.of_sdk_keywords()
    assert not (tmp_path / "home").exists()  # no emulator started
    assert connection.of_sdk_keywords("given-key").native()["base_url"] is None
    session = tgnb.attach("tgnb-demo", create=True)
    assert session.emulator is not None and session.backend_name == "local"
    # "local" comes from what was attached, not from the URL: the same loopback cloud without
    # the emulator's operations is a service cluster of its type
    assert tgnb.Session(session.cloud, session.cluster).backend_name == "kubernetes"


def test_every_plane_has_one_client_factory_and_one_translation(
    emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint's SDK client and its clusters API carry the project; a 404 from either plane
    is one translation (`tgnb.cloud.client.translate`), each naming what lists what exists."""
    monkeypatch.setenv("TGNB_HOME", str(emulator.home))
    monkeypatch.delenv("TOGETHER_API_KEY", raising=False)
    monkeypatch.delenv("TOGETHER_PROJECT_ID", raising=False)
    end = connection.connect(True)
    assert end.project_id and end.sdk().project_id == end.project_id
    with end.clusters() as cloud:
        assert cloud.project_id == end.project_id and cloud.base_url == end.base_url
        assert str(cloud.client.base_url).rstrip("/") == str(end.sdk().base_url).rstrip("/")
        with pytest.raises(tgnb.NotFoundError, match=r"read cluster nope.*Cloud.clusters\(\)"):
            cloud._call(lambda: cloud.client.clusters.retrieve("nope"), "read cluster nope")
    models = end.sdk().post_training.model_resources
    with pytest.raises(tgnb.NotFoundError, match=r"read resource nope.*pt.resources\(\)") as info:
        end.call(lambda: models.retrieve("nope"), "read resource nope")
    assert info.value.__cause__ is None and emulator.api_key not in str(info.value)
