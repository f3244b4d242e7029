"""The local backend under the one-mode protocol: it starts runs the session recorded, never
records one itself; its logs are the raw lines of train.log, tailed by `tgnb.runs.logtail`."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tgnb.backends.base import JobState, RunSpec
from tgnb.backends.local import LocalBackend
from tgnb.errors import BackendError
from tgnb.events import STDOUT_PREFIX
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore

SPEC = RunSpec(name="grpo-x", train={"algorithm": "grpo", "max_steps": 3})


def backend(store: RunStore) -> LocalBackend:
    return LocalBackend(
        store,
        cluster_id="c-1",
        cluster_type="KUBERNETES",
        base_url="http://127.0.0.1:9",
        api_key=None,
    )


def test_submit_of_an_unrecorded_run_is_refused_and_records_nothing(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(BackendError, match=r"session\.launch"):
        backend(store).submit(SPEC)
    assert store.list() == []


def test_follow_yields_raw_lines_and_run_parses_the_records(tmp_path: Path) -> None:
    """No supervisor runs: the test writes train.log and the final state as one would."""
    store = RunStore(tmp_path)
    run_dir = tmp_path / "runs" / "grpo-x"
    run_dir.mkdir(parents=True)
    rec = store.create(SPEC, backend="local", cluster_id="c-1", run_dir=str(run_dir))
    store.add_job(rec.id, rec.id)
    log = run_dir / "train.log"

    def write() -> None:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write("hello\n")
            fh.flush()
            time.sleep(0.3)
            fh.write(STDOUT_PREFIX + '{"kind": "metrics", "step": 1}\n' + "tail without newline")
        store.set_state(rec.id, JobState.SUCCEEDED, "finished", exit_code=0)

    threading.Thread(target=write).start()
    local = backend(store)
    raw = list(local.logs(rec.id, follow=True))
    assert (
        raw[0] == "hello" and raw[1].startswith(STDOUT_PREFIX) and raw[2] == "tail without newline"
    )
    assert list(local.logs(rec.id)) == raw
    run = Run(store.get(rec.id), store, local)
    assert list(run.follow(records=True)) == [{"kind": "metrics", "step": 1}]
    assert run.logs() == ["hello", "tail without newline"]
