"""The ``%tg`` magics under the second red-team pass's lines (issue 24, items 13 and 17), in a real
IPython shell attached to a real emulator: each is a one-line `UsageError` raised before anything
is sent, no run is recorded, no node is preempted and the namespace is unchanged. Then YAML alias
bombs through every way a run's config comes in (``--set``, a ``%%tg launch`` body, a config file
for `Session.launch`, `tgnb.tasks.config.load`, papermill parameters), each refused in well under a
second with nothing stored."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .conftest import FAKE_KEY, record

#: An anchor in a --set value (refused whatever follows it).
BOMB_FLOW = '&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'
#: About 270 bytes that expand to 9**6 strings (the "billion laughs", YAML flavour).
BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "trl: {x: [*e,*e,*e,*e,*e,*e,*e,*e,*e]}\n"
)

LINES = [
    # item 17: numbers and durations
    "events --since 100000000d",
    "events --since 0s",
    "scale --preemptible 8 --wait --timeout 100000000d",
    "scale --preemptible 8 --wait --timeout 0",
    "scale --preemptible 8 --wait --timeout 0s",
    "pt start tgnb/tiny-llama --inactive-timeout 100000000d",
    "pt start tgnb/tiny-llama --inactive-timeout 0",
    "scale --preemptible 1_6",
    "scale --preemptible \u0661\u0666",  # Arabic-Indic 16
    "scale --preemptible \uff11\uff16",  # fullwidth 16
    "launch grpo --steps 1_0",
    "launch grpo --steps \u0665",
    "launch grpo --lr 1_0e-4",
    "launch grpo --lr \u0661e-4",
    "events --since \u0661h",
    "pt open --rank 1_6",
    "pt open --dropout 1e999",
    # item 17: empty names
    "preempt ''",
    "preempt ' '",
    "watch ''",
    "logs ''",
    "stop ''",
    "attach ''",
    "events --node ''",
    "pt attach ''",
    # item 17: an option given twice
    "scale --preemptible 8 --preemptible 16",
    "scale --preemptible=8 --preemptible 16",
    "scale --preemptible 8 --preempt 16",
    "launch grpo --steps 5 --steps 6",
    "launch grpo --name a --name b",
    "launch grpo -o r1 --out r2",
    "events --since 1h --since 2h",
    "pt start tgnb/tiny-llama --generators 1 --generators 2",
    # item 17: -o names that would replace the namespace's own
    "launch grpo -o __builtins__",
    "launch grpo -o __name__",
    "launch grpo -o class",
    "launch grpo -o 'a b'",
    "launch grpo -o In",
    "launch grpo -o get_ipython",
    "pt start tgnb/tiny-llama -o __builtins__",
    "pt open -o None",
    # issue 48: a --command a shell could not split (an unclosed quote): no traceback
    'certify loop.py --command "python \'ok.py"',
    # issue 50: a fault-tolerant certify on one node, or of an unknown kind
    "certify loop.py --fault-tolerance torchft",
    "certify loop.py --nodes 2 --fault-tolerance torchfx",
    # item 13: an alias bomb in --set
    f"launch grpo --set 'trl.x={BOMB_FLOW}'",
    "launch grpo --set 'trl.x=[*a]'",
    # item 17: a line too long to expand
    "events --since " + "$" * 200_000,
    "attach " + "{x}" * 100_000,
]


@pytest.fixture(scope="module")
def shell(ip: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    home = tmp_path_factory.mktemp("magics2")
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


def _state(ip: Any, tg: Any) -> tuple[Any, ...]:
    ns = ip.user_ns
    nodes = [(n.name, n.status) for n in tg.session.status().nodes]
    keys = ("__builtins__", "__name__", "In", "get_ipython", "r1", "r2")
    return ([r.name for r in tg.session.store.list()], nodes, [id(ns.get(k)) for k in keys])


def _refused(ip: Any, emu: EmulatorHandle, run: Any) -> tuple[bool, str]:
    started = time.monotonic()
    try:
        run()
    except UsageError as exc:
        text = str(exc)
        leaked = FAKE_KEY[:12] in text or emu.api_key in text
        fast = time.monotonic() - started < 5
        ok = "\n" not in text.strip() and fast and len(text) < 600
        record(ok, secret=leaked)
        return ok and not leaked, text
    except SystemExit as exc:
        record(False, server_error=True)
        return False, f"SystemExit {exc}"
    except Exception as exc:
        record(False, server_error=True)
        return False, f"untyped {type(exc).__name__}: {exc}"[:300]
    record(False)
    return False, "accepted"


@pytest.mark.parametrize("line", LINES, ids=[repr(x)[:40] for x in LINES])
def test_magic_line_refused(shell: tuple[Any, Any, EmulatorHandle], line: str) -> None:
    ip, tg, emu = shell
    before = _state(ip, tg)
    ok, text = _refused(ip, emu, lambda: ip.run_line_magic("tg", line))
    assert ok, f"%tg {line[:60]}: {text}"
    assert _state(ip, tg) == before
    assert ip.user_ns["__builtins__"] in (builtins, builtins.__dict__)


def test_bomb_in_a_launch_body_refused(shell: tuple[Any, Any, EmulatorHandle]) -> None:
    ip, tg, emu = shell
    before = _state(ip, tg)
    ok, text = _refused(ip, emu, lambda: ip.run_cell_magic("tg", "launch grpo", BOMB))
    assert ok and "alias" in text, text
    assert _state(ip, tg) == before


def test_variables_still_expand(shell: tuple[Any, Any, EmulatorHandle]) -> None:
    """``$name`` and ``{expr}`` in a line still expand as IPython expands them (the magic does
    it itself, after the length check): an age from a variable is read, a bad one refused."""
    ip, _tg, _emu = shell
    ip.user_ns["age"] = "2h"
    ip.run_line_magic("tg", "events --since $age")
    ip.run_line_magic("tg", "events --since {age}")
    ip.user_ns["age"] = "1_0h"
    with pytest.raises(UsageError, match="1_0h"):
        ip.run_line_magic("tg", "events --since $age")


def test_bomb_through_the_python_api(
    shell: tuple[Any, Any, EmulatorHandle], tmp_path: Path
) -> None:
    """The same bomb as a config file for `Session.launch` and `tgnb.tasks.config.load`, and as
    papermill parameters of ``tgnb notebooks run``: a typed error, fast, nothing stored."""
    from tgnb import batch
    from tgnb.errors import TgnbError
    from tgnb.tasks.config import load

    ip, tg, _emu = shell
    path = tmp_path / "bomb.yaml"
    path.write_text("algorithm: grpo\n" + BOMB, encoding="utf-8")
    before = _state(ip, tg)
    for ident, call in (
        ("Session.launch", lambda: tg.session.launch(str(path))),
        ("config.load", lambda: load(path)),
        ("config.load --set", lambda: load(None, [f"trl.x={BOMB_FLOW}"])),
        ("notebooks -p", lambda: batch._value(BOMB_FLOW)),
    ):
        started = time.monotonic()
        try:
            call()
        except TgnbError as exc:
            ok = time.monotonic() - started < 2 and "alias" in str(exc)
            record(ok)
            assert ok, (ident, str(exc))
        else:
            record(False)
            raise AssertionError(f"{ident}: the bomb was accepted")
    assert _state(ip, tg) == before
    store = Path(tg.session.store.path) if hasattr(tg.session.store, "path") else None
    if store is not None and store.exists():
        assert store.stat().st_size < 10_000_000
