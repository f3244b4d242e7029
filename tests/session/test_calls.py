"""Functions run on a node, submitit-style (issue 47 §1): ``session.submit(fn, *args)``,
``session.map(fn, items)``, ``run.result()``, on the local engine (a real emulator over HTTP, the
real supervisor, real processes). The functions are this module's, which the node cannot import:
they travel by value, as a notebook cell's do.

What cannot reach a node is refused at submit with one line naming it and the fix, nothing
launched; a function with a `tgnb.train.Checkpointer` loop, preempted once, returns its value
with every step run once.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.errors import CallError, NotPicklableError, ValidationError
from tgnb.events import JOB_RELEASED
from tgnb.runs import call
from tgnb.runs.spec import JobState
from tgnb.session import Session


def square(x: int, offset: int = 0) -> dict[str, Any]:
    return {"square": x * x + offset, "pid_seen": x}


def boom(message: str) -> None:
    def deeper() -> None:
        raise ValueError(message)

    deeper()


def _counted(steps: int) -> int:
    """A plain PyTorch loop through the Checkpointer, printing each step: the sum of the steps
    it ran, as a function's value."""
    import torch

    from tgnb.train import Checkpointer

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = Checkpointer(model, opt, max_steps=steps, dir="out")
    for step in ckpt.steps():
        time.sleep(0.05)
        model(torch.ones(4)).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.log(loss=float(step))
        print(f"step {step}", flush=True)
    return steps * (steps + 1) // 2


class _Launches:
    """A stand-in for `Session.launch` that records what it was asked (nothing is started)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        return str(kwargs["name"])


def test_what_cannot_reach_a_node_is_refused_at_submit(tmp_path: Path) -> None:
    launches = _Launches()
    ex = call.Executor(launches, {"workdir": tmp_path})
    lock = threading.Lock()
    with open(tmp_path / "data.txt", "w") as fh, socket.socket() as sock:

        def uses_the_file() -> str:
            return fh.name

        def uses_the_lock() -> None:
            with lock:
                pass

        cases = [
            (lambda: ex.submit(square, lock), r"^argument 1 of square is a thread lock \(lock\)"),
            (
                lambda: ex.submit(uses_the_file),
                r"^.*uses_the_file's closure variable 'fh' is an open file \(TextIOWrapper\), "
                r"which lives only in this process and cannot be sent to a node: create it "
                r"inside the function \(pass a file's path, not the file\)$",
            ),
            (lambda: ex.submit(uses_the_lock), r"closure variable 'lock' is a thread lock"),
            (lambda: ex.submit(square, 2, offset=sock), r"keyword argument 'offset' .* a socket"),
            (lambda: ex.map(square, [1, 2, (i for i in [])]), r"argument 1 of square is a gen"),
            (lambda: ex.submit(3), r"^submit takes a function and its arguments, got int"),
        ]
        for submit, match in cases:
            with pytest.raises((NotPicklableError, ValidationError), match=match) as info:
                submit()
            assert "\n" not in str(info.value), info.value
    assert launches.calls == []  # nothing launched, not even map's first items

    ok = ex.map(square, [1, 2], [10, 20])
    assert len(ok) == 2 and [c["name"] for c in launches.calls] == ok
    first = launches.calls[0]
    assert first["command"][:3] == ["python", "-m", "tgnb.train.call"]
    assert first["recovery"] == {"max_restarts": 0}  # a failed call is not run again
    assert list(first["files"]) == [first["command"][3]]


def test_a_module_function_travels_by_value_unless_the_workdir_ships_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle
    import sys

    lib, wd = tmp_path / "lib", tmp_path / "wd"
    lib.mkdir()
    wd.mkdir()
    (lib / "helpers_47.py").write_text("def plus(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(lib))
    import helpers_47  # type: ignore[import-not-found]

    shipped = call.pack(helpers_47.plus, (1,), {}, lib)  # in the workdir: by reference
    travels = call.pack(helpers_47.plus, (1,), {}, wd)  # elsewhere: by value
    monkeypatch.delitem(sys.modules, "helpers_47")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(lib)])
    with pytest.raises(ModuleNotFoundError):
        pickle.loads(shipped)  # the node imports it from the snapshot
    fn, args, kwargs = pickle.loads(travels)
    assert fn(*args, **kwargs) == 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_submit_and_map_return_values_and_the_node_exception(
    session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wd = tmp_path / "notebook"
    wd.mkdir()
    monkeypatch.chdir(wd)  # the notebook's folder: the default workdir
    run = session.submit(square, 7, offset=1)
    runs = session.map(square, [1, 2, 3])
    failing = session.executor(name="fails").submit(boom, "no good")
    assert run.result(timeout=300) == {"square": 50, "pid_seen": 7}
    assert [r.result(timeout=300)["square"] for r in runs] == [1, 4, 9]
    assert [r.name.rsplit("-", 1)[1] for r in runs] == ["0", "1", "2"]

    with pytest.raises(ValueError, match=r"^no good\nraised on node ") as info:
        failing.result(timeout=300)
    assert str(info.value) == "no good"  # the function's own exception, its note added
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on node " in note and "of run 'fails'" in note, note
    assert "in deeper" in note and "ValueError: no good" in note, note  # the node's frames
    assert failing.state is JobState.FAILED and failing.restart_count == 0
    assert failing.status.detail == "ValueError: no good", failing.status

    plain = session.launch(command=["python", "-c", "print(1)"], name="plain")
    with pytest.raises(ValidationError, match=r"runs no submitted function, so it has no result"):
        plain.result()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_preempted_function_resumes_from_its_checkpoint(session: Session, tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    run = session.executor(name="counted", workdir=tmp_path / "wd").submit(_counted, 80)
    wait_until(lambda: sum(ln.startswith("step ") for ln in run.logs()) >= 20, timeout=300)
    session.preempt(run.status.nodes[0])
    assert run.result(timeout=400) == 80 * 81 // 2
    steps = [int(ln.split()[1]) for ln in run.logs() if ln.startswith("step ")]
    assert steps == list(range(1, 81)), steps  # every step once: resumed after the last saved
    causes = [e.data["cause"] for e in run.run_events() if e.reason == JOB_RELEASED]
    assert causes == ["preempted", "done"], causes
    assert run.summary()["preemptions"] == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_cancelled_call_has_no_result(session: Session, tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    run = session.executor(workdir=tmp_path / "wd").submit(time.sleep, 600)
    wait_until(lambda: run.status.nodes, timeout=120)
    run.stop()
    with pytest.raises(CallError, match=r"cancelled.* before its function returned: no result"):
        run.result(timeout=120)
