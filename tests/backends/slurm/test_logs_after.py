"""A remote Slurm run's records come from its output file over SSH, after a byte offset: a second
poll fetches only the bytes written since the first (counted, not timed), and gives the same
records as reading the whole file. Against a real sshd on loopback (the `login_node` fixture)."""

from __future__ import annotations

import json
from pathlib import Path

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.slurm import CommandRunner, SlurmBackend
from tgnb.events import STDOUT_PREFIX, Event, dedupe, from_record, parse_record, utcnow
from tgnb.runs import cursor
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore


def _metrics(step: int) -> str:
    return STDOUT_PREFIX + json.dumps({"kind": "metrics", "step": step, "loss": 1 / step})


def _event(reason: str, step: int) -> str:
    ev = Event(utcnow(), "run", reason, f"at step {step}", data={"step": step})
    return STDOUT_PREFIX + json.dumps({"kind": "events", **ev.to_dict()})


def test_a_second_poll_fetches_only_the_new_lines(
    tmp_path: Path, login_node: tuple[str, tuple[str, ...]]
) -> None:
    host, options = login_node
    backend = SlurmBackend(
        runner=CommandRunner(host, ssh_options=options), runs_root=tmp_path / "remote", gres=False
    )
    run_dir = tmp_path / "remote" / "long"
    run_dir.mkdir(parents=True)
    backend.attach("4242", run_dir)
    out = run_dir / "slurm-4242.out"
    lines = [_event("RunStarted", 0)]
    for step in range(1, 5001):
        lines += [f"step {step} of the program's own output", _metrics(step)]
    out.write_text("\n".join(lines) + "\n")
    store = RunStore(tmp_path / "home")
    rec = store.create(RunSpec(name="long", train={}, resources=Resources()), backend="slurm")
    store.add_job(rec.id, "4242")  # no run directory on this machine: the engine's output is read
    run = Run(store.get(rec.id), store, backend)

    assert [r["step"] for r in run.records("metrics")] == list(range(1, 5001))
    fetched = cursor.engine_log(backend, "4242").read
    assert fetched == out.stat().st_size

    new = [_metrics(5001), "a line of text", _event("CheckpointSaved", 5001)]
    with open(out, "a") as fh:
        fh.write("\n".join(new) + "\n" + _metrics(5002)[:20])  # and half of the next line
    rows = run.records("metrics")
    assert [r["step"] for r in rows[-2:]] == [5000, 5001]
    second = cursor.engine_log(backend, "4242").read - fetched
    assert second == len("\n".join(new)) + 1 + 20  # only what was written since
    assert [e.reason for e in run.run_events()] == ["RunStarted", "CheckpointSaved"]
    half = cursor.engine_log(backend, "4242").read - fetched - second
    assert half == 20  # nothing new: only the unfinished line is fetched again

    # the same records as reading the whole output, the half line kept for when it ends
    with open(out, "a") as fh:
        fh.write(_metrics(5002)[20:] + "\n")
    whole = [r for ln in out.read_text().splitlines() if (r := parse_record(ln)) is not None]
    assert [r["step"] for r in run.records("metrics")] == [
        r["step"] for r in whole if r["kind"] == "metrics"
    ]
    last = cursor.engine_log(backend, "4242").read - fetched - second - half
    assert last == len(_metrics(5002)) + 1
    evs = [from_record({k: v for k, v in r.items() if k != "kind"}) for r in whole]
    assert run.run_events() == dedupe(e for e in evs if e is not None)


def test_following_the_log_fetches_each_page_after_the_last(
    tmp_path: Path, login_node: tuple[str, tuple[str, ...]]
) -> None:
    """The live log (`%tg logs --follow`, the sidebar's log pages): the next page of a remote
    job's output is fetched after the engine's offset, not the whole output again."""
    from tgnb.runs import livelog

    host, options = login_node
    backend = SlurmBackend(
        runner=CommandRunner(host, ssh_options=options), runs_root=tmp_path / "remote", gres=False
    )
    run_dir = tmp_path / "remote" / "follow"
    run_dir.mkdir(parents=True)
    backend.attach("77", run_dir)
    out = run_dir / "slurm-77.out"
    out.write_text("".join(f"line {k}\n" for k in range(20_000)))
    store = RunStore(tmp_path / "home")
    rec = store.create(RunSpec(name="follow", train={}, resources=Resources()), backend="slurm")
    store.add_job(rec.id, "77")
    run = Run(store.get(rec.id), store, backend)

    first = livelog.page(run, raw=True)
    assert [text for _, text in first.lines] == [f"line {k}" for k in range(20_000)]
    fetched = cursor.engine_log(backend, "77").read
    assert fetched == out.stat().st_size
    with open(out, "a") as fh:
        fh.write("line 20000\nline 20001\nline 2000")  # and part of the next
    second = livelog.page(run, first.cursor, first.attempt, raw=True)
    assert [text for _, text in second.lines] == ["line 20000", "line 20001"]
    assert cursor.engine_log(backend, "77").read - fetched == len(
        "line 20000\nline 20001\nline 2000"
    )
    with open(out, "a") as fh:
        fh.write("2\n")
    third = livelog.page(run, second.cursor, second.attempt, raw=True)
    assert [text for _, text in third.lines] == ["line 20002"]
    # a page that is not the next one (another viewer) reads the output whole, as before
    again = livelog.page(run, 5, first.attempt, raw=True)
    assert [text for _, text in again.lines][:1] == ["line 5"] and again.cursor == 20_003
