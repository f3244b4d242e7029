"""The run store: a real sqlite file under a temporary tgnb home, opened by several stores and
processes at once."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tgnb.backends.base import JobState, Resources, RunSpec, SecretRef
from tgnb.errors import ApiError, NotFoundError, TrainConfigError, ValidationError
from tgnb.runs.spec import SCHEMA
from tgnb.runs.store import STORE_FILE, RunStore
from tgnb.runs.trainconfig import TrainConfig, from_dict


def _spec(name: str = "grpo-a") -> RunSpec:
    return RunSpec(
        name=name,
        train={"algorithm": "grpo", "max_steps": 7, "trl": {"learning_rate": 0.005}},
        resources=Resources(nodes=2, min_nodes=1, gpus_per_node=8, preemptible=True),
        partition="low",
        env={"A": "1"},
        secrets={"HF_TOKEN": SecretRef(name="hf", key="token", env="HF_TOKEN")},
    )


def test_spec_round_trip_keeps_every_field(tmp_path: Path) -> None:
    spec = _spec()
    assert isinstance(spec.train, TrainConfig) and spec.train.name == "grpo-a"
    assert spec.to_dict()["schema"] == SCHEMA
    assert RunSpec.from_dict(spec.to_dict()) == spec
    store = RunStore(tmp_path)
    store.create(spec, backend="local", run_dir=tmp_path / "runs/grpo-a")
    assert RunStore(tmp_path).get("grpo-a").spec.train == spec.train  # from the sqlite file
    old = {**spec.to_dict(), "train": {"algorithm": "grpo", "max_steps": 7}}  # as stored before
    assert RunSpec.from_dict(old).train == from_dict({"name": "grpo-a", "max_steps": 7})


#: A record as the store wrote it before the schema field (and before ``fault_tolerance``).
OLD_RECORD = (
    '{"account": null, "budget_usd": null, "env": {"A": "1"}, "image": null, "name": "grpo-a", '
    '"partition": "low", "prices": null, "recovery": null, "resources": {"cpus_per_task": null, '
    '"gpus_per_node": 8, "memory_gib": null, "min_nodes": 1, "nodes": 2, "preemptible": true}, '
    '"run_dir": "/data/runs/grpo-a", "secrets": {"HF_TOKEN": {"env": "HF_TOKEN", "key": "token", '
    '"name": "hf"}}, "time_limit": null, "train": {"algorithm": "grpo", "args": [], "checkpoint": '
    '{"keep_last": 3}, "command": null, "dataset": "arithmetic", "dataset_size": 2000, "lora": '
    'null, "max_steps": 7, "model": "tiny", "name": "grpo-a", "rewards": ["correctness", '
    '"format"], "seed": 0, "trl": {"learning_rate": 0.005}}, "workdir": null}'
)


def test_a_record_written_before_the_schema_field_still_loads(tmp_path: Path) -> None:
    import sqlite3

    RunStore(tmp_path).create(_spec(), backend="local")
    with sqlite3.connect(tmp_path / STORE_FILE) as db:
        db.execute("UPDATE runs SET spec = ? WHERE name = 'grpo-a'", (OLD_RECORD,))
    spec = RunStore(tmp_path).get("grpo-a").spec
    assert spec.train.checkpoint.keep_last == 3 and spec.train.trl == {"learning_rate": 0.005}
    assert spec.train.fault_tolerance is None and spec.resources.min_nodes == 1
    assert spec.secrets["HF_TOKEN"] == SecretRef(name="hf", key="token", env="HF_TOKEN")
    assert RunSpec.from_dict(spec.to_dict()) == spec  # written again, with its schema


def test_a_record_of_a_newer_schema_is_refused_naming_the_fix() -> None:
    newer = {**_spec().to_dict(), "schema": SCHEMA + 1}
    with pytest.raises(ValidationError, match=r"newer than this tgnb reads.*upgrade tgnb"):
        RunSpec.from_dict(newer)


def test_a_mapping_with_an_unknown_key_is_refused_when_the_spec_is_built() -> None:
    with pytest.raises(TrainConfigError, match="unknown config key 'max_step'"):
        RunSpec(name="typo", train={"algorithm": "grpo", "max_step": 5})


def test_create_record_history_and_reopen(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    rec = store.create(_spec(), backend="local", cluster_id="c-1", run_dir=tmp_path / "runs/grpo-a")
    assert rec.state == JobState.PENDING and rec.name == "grpo-a" and rec.id.startswith("run-")
    store.add_job(rec.id, rec.id, pid=123)
    store.set_state("grpo-a", JobState.RUNNING, "on n0", node="n0", nodes=["n0"])
    store.set_state(rec.id, JobState.REQUEUED, "n0 preempted", node="n0", restart_count=1)
    store.set_state(rec.id, JobState.RUNNING, "on n1", node="n1", nodes=["n1"], restart_count=1)
    store.set_state(rec.id, JobState.SUCCEEDED, "finished", exit_code=0)
    store.set_state(rec.id, JobState.RUNNING, "a late writer")  # ignored: the run has finished

    again = RunStore(tmp_path)  # a fresh kernel opening the same home
    got = again.get("grpo-a")
    assert got.spec == _spec()
    assert got.cluster_id == "c-1" and got.backend == "local"
    assert got.run_dir == str(tmp_path / "runs/grpo-a")
    assert got.state == JobState.SUCCEEDED and got.exit_code == 0
    assert got.restart_count == 1 and got.nodes == ("n1",)
    assert got.job_id == rec.id and got.jobs[0].info == {"pid": 123}
    states = [(h.state, h.node) for h in again.history(rec.id)]
    assert states == [
        (JobState.PENDING, None),
        (JobState.RUNNING, "n0"),
        (JobState.REQUEUED, "n0"),
        (JobState.RUNNING, "n1"),
        (JobState.SUCCEEDED, None),
    ]
    assert [r.name for r in again.list(active=False)] == ["grpo-a"]
    assert again.list(active=True) == []
    assert again.list(cluster_id="other") == []


def test_names_are_unique_and_valid(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create(_spec("same"), backend="local")
    with pytest.raises(ValidationError, match="already exists"):
        store.create(_spec("same"), backend="local")
    with pytest.raises(ValidationError, match="not valid"):
        store.create(_spec("Bad_Name"), backend="local")
    with pytest.raises(NotFoundError, match="no run named") as missing:
        store.get("missing")
    assert not isinstance(missing.value, ApiError)  # a lookup in the store, no API was asked
    assert [r.name for r in store.list()] == ["same"]


def _writer(home: str, name: str, n: int) -> None:
    store = RunStore(home)
    for i in range(n):
        store.set_state(name, JobState.RUNNING, f"beat {i}")


def test_concurrent_writers_from_several_processes(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    for name in ("w-a", "w-b", "w-c"):
        store.create(_spec(name), backend="local")
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_writer, args=(str(tmp_path), n, 40)) for n in ("w-a", "w-b", "w-c")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for name in ("w-a", "w-b", "w-c"):
        assert len(store.history(name)) == 41
    assert (tmp_path / "runs.sqlite").exists()


def test_a_run_in_unknown_state_still_holds_its_gpus(tmp_path: Path) -> None:
    """A run whose supervisor is gone is recorded UNKNOWN (`Run.sync`); its training processes may
    still run on its nodes, so another run's placement does not take those GPUs until it is
    recovered or finished."""
    store = RunStore(tmp_path)
    a = store.create(_spec("a"), backend="local", cluster_id="c-1", run_dir=None)
    b = store.create(_spec("b"), backend="local", cluster_id="c-1", run_dir=None)
    nodes = [("n1", 8), ("n2", 8)]
    common = {"least": 1, "gpus_per_node": 8, "restart_count": 0}
    assert store.claim(a.id, nodes, want=1, **common) == ["n1"]
    store.set_state(a.id, JobState.UNKNOWN, "its supervisor is gone", nodes=["n1"])
    assert store.claim(b.id, nodes, want=2, **common) == ["n2"]  # n1 is still a's
    store.set_state(a.id, JobState.FAILED, "gone")
    store.set_state(b.id, JobState.PENDING)
    assert sorted(store.claim(b.id, nodes, want=2, **common)) == ["n1", "n2"]
