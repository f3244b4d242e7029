"""The ``%tg`` magics under hostile lines, in a real IPython shell attached to a real emulator:
each is a one-line `UsageError` (no traceback), shows no secret and records no run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.error import UsageError

from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .conftest import FAKE_KEY, record

LINES = [
    "launch grpo --steps -5",
    "launch grpo --steps 0",
    "launch grpo --steps 1e23",
    "launch grpo --steps 100000000000000000000000",
    "launch grpo --reward os:system",
    "launch grpo --reward nope",
    "launch grpo --model '$(touch /tmp/tgnb-pwned)'",
    "launch grpo --model 'a\u2028b'",
    "launch grpo --name 'a b'",
    "launch grpo --name 'x\u2028'",
    "launch grpo --name UPPER",
    "launch grpo --seed -1",
    "launch grpo --lr nan",
    "launch grpo --lr inf",
    "launch grpo --nodes 0",
    "launch grpo --nodes 1000000000",
    "launch grpo --gpus-per-node 1000",
    "launch grpo --dataset nope",
    f"launch grpo --set trl.hub_token={FAKE_KEY}",
    "launch grpo --set evil=1",
    "launch grpo --set checkpoint.every_steps=-1",
    "launch grpo --set checkpoint.auto=maybe",
    "launch grpo --set checkpoint.failures_per_hour=0",
    "launch ppo",
    "launch",
    "scale --preemptible 99999999999999999999",
    "scale --preemptible 12",
    "scale --preemptible -8",
    "scale --preemptible abc",
    "attach " + "x" * 5000,
    "events --since forever",
    "logs nope",
    "preempt nope",
    "nosuchcommand",
    "launch grpo --steps 'unclosed",
]


@pytest.fixture(scope="module")
def shell(ip: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    home = tmp_path_factory.mktemp("magics")
    with running_emulator(home, time_scale=0.01) as emu:
        tg = ip.magics_manager.registry["Tg"]
        mp = pytest.MonkeyPatch()
        for key, value in emu.env.items():
            mp.setenv(key, value)
        mp.setenv("TGNB_HOME", str(home))
        tg.session = None
        ip.run_line_magic("tg", "attach --local")
        yield ip, tg, emu
        tg.session = None
        mp.undo()


@pytest.mark.parametrize("line", LINES, ids=[repr(x)[:40] for x in LINES])
def test_magic_line_refused(shell: tuple[Any, Any, EmulatorHandle], line: str) -> None:
    ip, tg, emu = shell
    before = [r.name for r in tg.session.store.list()]
    try:
        ip.run_line_magic("tg", line)
    except UsageError as exc:
        text = str(exc)
        leaked = FAKE_KEY[:12] in text or emu.api_key in text
        record("\n" not in text.strip(), secret=leaked)
        assert not leaked and "\n" not in text.strip(), text
    except SystemExit as exc:  # argparse must not exit the kernel
        record(False, server_error=True)
        raise AssertionError(f"SystemExit {exc}") from None
    except Exception as exc:
        record(False, server_error=True)
        raise AssertionError(f"untyped {type(exc).__name__}: {exc}"[:300]) from None
    else:
        record(False)
        raise AssertionError(f"%tg {line} was accepted")
    assert [r.name for r in tg.session.store.list()] == before
