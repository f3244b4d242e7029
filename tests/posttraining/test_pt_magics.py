"""``%tg pt ...`` in a real IPython shell against a real emulator daemon: help everywhere, tables
with HTML and text, a resource started, a session opened, the panel and the cost, and bad lines
refused as one-line UsageErrors with nothing sent (the emulator's request log stays empty)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError

from tests.conftest import heavy_in, modules_after
from tgnb.emulator.testing import EmulatorHandle
from tgnb.notebook.commands import names
from tgnb.notebook.tables import Table

SUBCOMMANDS = [
    "connect",
    "models",
    "resources",
    "start",
    "attach",
    "sessions",
    "open",
    "stop",
    "checkpoints",
    "save",
    "download",
    "cost",
    "panel",
    "watch",
    "events",
]


@pytest.fixture
def pt(ip: Any) -> Iterator[Any]:
    magics = ip.magics_manager.registry["Tg"]
    magics._pt = None
    yield magics
    magics._pt = None


@pytest.fixture
def emu(rl_emulator: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> EmulatorHandle:
    """B's shared daemon (tests/emulator/rl/conftest.py); %tg pt's local connection finds it
    through TGNB_HOME (its home), so no other daemon is started."""
    monkeypatch.setenv("TGNB_HOME", str(rl_emulator.home))
    return rl_emulator


def test_help_everywhere(ip: Any, pt: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert sorted(names("pt")) == sorted(SUBCOMMANDS)
    ip.run_line_magic("tg", "pt --help")
    listing = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert f"  {name} " in listing
        ip.run_line_magic("tg", f"pt {name} --help")
        assert capsys.readouterr().out.startswith(f"usage: %tg pt {name}")


def test_unknown_and_unattached(ip: Any, pt: Any) -> None:
    with pytest.raises(UsageError, match="unknown subcommand 'sesions': did you mean 'sessions'"):
        ip.run_line_magic("tg", "pt sesions")
    with pytest.raises(UsageError, match="no current model resource: %tg pt start MODEL"):
        ip.run_line_magic("tg", "pt sessions")
    with pytest.raises(UsageError, match="takes no cell body"):
        ip.run_cell_magic("tg", "pt models", "x")


@pytest.mark.slow
def test_start_open_panel_cost_stop(
    ip: Any, pt: Any, emu: EmulatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    models = ip.run_line_magic("tg", "pt models")
    from tgnb.emulator.rl.catalog import materialize_tiny

    # the built-in model, listed by its directory (its alias: tgnb/tiny-llama); read here without
    # a request (the test counts them below)
    listed = str(materialize_tiny())
    assert isinstance(models, Table) and listed in str(models) and "tiny-llama" in listed
    assert "<table" in models._repr_html_()
    ip.run_line_magic("tg", "pt start tgnb/tiny-llama --generators 1 --inactive-timeout 15m -o res")
    res = ip.user_ns["res"]
    assert "READY" in capsys.readouterr().out
    assert res.info().inactive_timeout == 900

    ip.run_line_magic("tg", "pt open --rank 4 --alpha 8 --name m1 -o s1")
    assert ip.user_ns["s1"].name == "m1"
    emu.clear_requests()
    bad = [
        ("pt open --rank x", "'x' is not a whole number"),
        ("pt open --rnak 4", "unknown option '--rnak': did you mean '--rank'"),
        ("pt open --name 'two words'", "session name 'two words' is not valid"),
        ("pt open --rank 4 -o 1x", "is not a Python name"),
        ("pt start tgnb/tiny-llama --generators -1", "must be >= 0"),
        ("pt start tgnb/tiny-llama --generators 99", "generators=99 is out of range"),
        ("pt start tgnb/tiny-llama --inactive-timeout 1m", "inactive_timeout=60 is out of range"),
        ("pt download ck-1 --variant lora", "checkpoint variant 'lora' is not known"),
        ("pt stop --session m1 --force", "--force stops a resource, not a session"),
        ("pt attach ../x", "is not an id"),
    ]
    for line, match in bad:
        with pytest.raises(UsageError, match=match):
            ip.run_line_magic("tg", line)
    assert emu.requests() == [], "a bad line sent a request"
    # a rank's range is the model's: the service refuses it, the user reads the fix (nothing opened)
    with pytest.raises(UsageError, match=r"LoRA rank 0 is out of range: use 1 to 64"):
        ip.run_line_magic("tg", "pt open --rank 0")

    sessions = ip.run_line_magic("tg", "pt sessions")
    assert isinstance(sessions, Table) and [r[1] for r in sessions.rows] == ["m1"]
    resources = ip.run_line_magic("tg", "pt resources")
    assert res.id in str(resources)
    (row,) = [r for r in resources.rows if r[0] == res.id]
    gpus, price, so_far = row[5:8]
    assert gpus == "2" and price == "$18.00/h"  # 9 USD per GPU-hour on the emulator
    assert so_far.startswith("$") and float(so_far.lstrip("$")) > 0
    assert "resource(s)" in resources.caption and " so far" in resources.caption
    cost = ip.run_line_magic("tg", "pt cost")
    assert cost.head[3] == "GPU-MINUTES" and float(cost.rows[0][3]) > 0
    # dollars per session: the one session open holds the whole cost so far
    assert [r[0] for r in cost.rows[1:]] == ["  session m1"]
    assert cost.rows[1][5].startswith("$") and "split by the time" in cost.caption
    # the emulator's minutes are its platform time, and say so; the resource prints readably
    assert "platform time of the local emulator" in cost.caption
    assert "platform s)" in str(cost) and "platform min" in str(cost)
    assert repr(res) == f"<Resource {res.id}: READY, tgnb/tiny-llama, LoRA>"
    panel = ip.run_line_magic("tg", "pt panel")
    try:
        bundle = panel._repr_mimebundle_()
        assert "m1" in bundle["text/html"] and "m1" in bundle["text/plain"]
    finally:
        panel.close()
    ip.run_line_magic("tg", "pt save m1")
    assert "inference checkpoint" in capsys.readouterr().out
    ckpts = ip.run_line_magic("tg", "pt checkpoints")
    assert [r[1] for r in ckpts.rows] == ["inference"]
    out_dir = emu.home / "dl"
    ip.run_line_magic("tg", f"pt download {ckpts.rows[0][0]} --variant adapter --out {out_dir}")
    assert "adapter_config.json" in capsys.readouterr().out
    assert (out_dir / "adapter_config.json").exists()
    ip.run_line_magic("tg", "pt events")
    out = capsys.readouterr().out
    assert "TrainingSessionStarted" in out and "TrainingSessionCheckpoint" in out
    timeline = ip.run_line_magic("tg", "pt events --timeline")
    assert [lane.kind for lane in timeline.lanes] == ["resource", "session"]

    # Stop refused while the session runs (the server's 400, as one line), then in order.
    with pytest.raises(UsageError, match=r"still has 1 active session\(s\) \(m1\)"):
        ip.run_line_magic("tg", "pt stop")
    capsys.readouterr()
    ip.run_line_magic("tg", "pt stop --session m1")
    ip.run_line_magic("tg", "pt stop")
    out = capsys.readouterr().out
    assert "STOPPED" in out and f"model resource {res.id}" in out
    assert emu.api_key not in out


def test_pt_magics_stay_light() -> None:
    """``%tg pt --help`` (and the parsing of any line) imports neither the SDK's Post-Training
    clients nor torch, transformers, TRL or peft."""
    loaded = modules_after(
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython(); ip.run_line_magic('load_ext', 'tgnb')\n"
        "ip.run_line_magic('tg', 'pt --help'); ip.run_line_magic('tg', 'pt open --help')"
    )
    assert heavy_in(loaded, also=["together"]) == []
