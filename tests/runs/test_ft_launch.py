"""A run launched as TorchFT replica groups (issue 50): ``fault_tolerance="torchft"`` reaches the
run's `TrainConfig` from `Session.launch`'s keyword, a config file's key and ``%tg launch
--fault-tolerance``, and the launch refuses what no engine can run as replica groups in one line
naming the fix, before anything is recorded (`tgnb.prelaunch.plan`, `tgnb.runs.ftcheck`)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from tgnb import prelaunch
from tgnb.errors import ValidationError
from tgnb.notebook.commands import COMMANDS
from tgnb.notebook.commands.launch import launch_request
from tgnb.runs import ftcheck
from tgnb.runs.outcome import UNPROTECTED
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.replicas import UNPROTECTED_GROUPS
from tgnb.runs.spec import Resources

SCRIPT = "import torchft\nprint(torchft.__name__)\n"


@pytest.fixture
def staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where staged snapshots go in this test (a refused launch must leave none)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SCRIPT, encoding="utf-8")
    return project


def _plan(
    folder: Path, what: str = "train.py", nodes: int = 2, min_nodes: int | None = None, **kw: Any
) -> prelaunch.LaunchPlan:
    res = Resources(nodes=nodes, min_nodes=min_nodes)
    return prelaunch.plan(what, workdir=folder, name="ft-run", resources=res, **kw)


def test_the_keyword_and_the_config_file_key_reach_the_train_config(
    folder: Path, staging: Path
) -> None:
    plan = _plan(folder, overrides={"fault_tolerance": "torchft"})
    assert plan.spec.train.fault_tolerance == "torchft"
    assert plan.spec.train.compact()["fault_tolerance"] == "torchft"
    plan.discard()
    config = folder / "ft.yaml"
    config.write_text("script: train.py\nfault_tolerance: torchft\n", encoding="utf-8")
    plan = _plan(folder, str(config))
    assert plan.spec.train.fault_tolerance == "torchft"
    plan.discard()
    plan = _plan(folder)  # not asked: a run that restarts from its checkpoint
    assert plan.spec.train.fault_tolerance is None
    plan.discard()


def test_a_program_without_tgnbs_hook_is_warned_as_replica_groups(
    folder: Path, staging: Path
) -> None:
    """A TorchFT program that never imports tgnb: a preempted group heals from the others, so
    the launch does not say a preemption restarts it from step 0 (it says that of other runs)."""
    plan = _plan(folder, overrides={"fault_tolerance": "torchft"})
    assert plan.warning == (
        f"tgnb: train.py is {UNPROTECTED_GROUPS}: use "
        "tgnb.train.Checkpointer(..., fault_tolerant=True) for periodic checkpoints too"
    )
    plan.discard()
    plan = _plan(folder)
    assert plan.warning is not None and UNPROTECTED in plan.warning
    plan.discard()
    (folder / "train.py").write_text(
        "import tgnb.train\nckpt = tgnb.train.Checkpointer(m, o, fault_tolerant=True)\n"
    )
    plan = _plan(folder, overrides={"fault_tolerance": "torchft"})
    assert plan.warning is None
    plan.discard()


def test_the_magic_flag() -> None:
    parser = COMMANDS["launch"].parser
    raw, options = launch_request(
        parser.parse_args(["train.py", "--nodes", "2", "--fault-tolerance", "torchft"]), None
    )
    assert raw["fault_tolerance"] == "torchft" and options == {"nodes": 2}
    raw, _ = launch_request(parser.parse_args(["train.py"]), "fault_tolerance: torchft\n")
    assert raw["fault_tolerance"] == "torchft"  # the %%tg launch body's key
    with pytest.raises(UsageError, match="invalid choice: 'elastic'"):
        parser.parse_args(["train.py", "--fault-tolerance", "elastic"])


@pytest.mark.parametrize(
    ("what", "kw", "fix"),
    [
        ("grpo", {}, "launch a script that uses torchft's Manager"),
        ("train.py", {"nodes": 1}, "nodes=2"),
        ("train.py", {"nodes": 3, "min_nodes": 2}, "drop min_nodes"),
        ("train.py", {"env": {"REPLICA_GROUP_ID": "3"}}, "drop it from env"),
        ("train.py", {"env": {"TGNB_FT_HEARTBEAT_TIMEOUT_MS": "2s"}}, "=2000"),
    ],
)
def test_refused_in_one_line_naming_the_fix_with_nothing_left(
    folder: Path, staging: Path, what: str, kw: dict[str, Any], fix: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        _plan(folder, what, overrides={"fault_tolerance": "torchft"}, **kw)
    text = str(exc.value)
    assert fix in text and "\n" not in text
    assert list(staging.iterdir()) == []  # the snapshot taken was discarded
    _plan(folder, what, **kw).discard()  # the same launch without torchft is fine


def test_an_unknown_way_is_refused_by_the_config(folder: Path, staging: Path) -> None:
    with pytest.raises(ValidationError, match="fault_tolerance='torchft'"):
        _plan(folder, overrides={"fault_tolerance": "elastic"})


def test_the_local_check_reads_this_interpreter(
    folder: Path, staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(folder, overrides={"fault_tolerance": "torchft"})
    spec = plan.spec
    ftcheck.require_here(spec)  # installed here (the main environment has torchft)
    monkeypatch.setattr(ftcheck.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValidationError, match=r"pip install .tgnb\[torchft\]."):
        ftcheck.require_here(spec)
    plan.discard()


@pytest.mark.parametrize(
    ("policy", "fix"),
    [
        (RecoveryPolicy(when_short="standard"), "drop when_short='standard'"),
        (RecoveryPolicy(deadline=time.time() + 6 * 3600), "drop deadline="),
    ],
)
def test_moves_between_classes_run_locally_and_slurm_and_kubernetes_refuse_them(
    folder: Path, staging: Path, tmp_path: Path, policy: RecoveryPolicy, fix: str
) -> None:
    """The local engine places each group by the policy (tests/backends/local/
    test_replica_groups.py); Slurm and Kubernetes have no placer per group: refused in their
    preflight, in one line naming the fix, before anything is rendered or sent."""
    from kubernetes.client import ApiClient

    from tgnb.backends.kubernetes.backend import KubernetesBackend
    from tgnb.backends.slurm.backend import SlurmBackend

    plan = _plan(folder, overrides={"fault_tolerance": "torchft"}, recovery=policy)
    spec = plan.spec  # planned: the local engine runs it, with nothing more to check
    assert spec.policy == policy
    slurm = SlurmBackend(runs_root=tmp_path / "slurm", gres=False)
    kube = KubernetesBackend(ApiClient(), "research", poll_interval=0.01)
    for engine, name in ((slurm, "Slurm"), (kube, "Kubernetes")):
        with pytest.raises(ValidationError) as exc:
            engine.preflight(spec)
        text = str(exc.value)
        assert fix in text and f"on {name} " in text and "\n" not in text, text
    assert not (tmp_path / "slurm").exists() or not any((tmp_path / "slurm").iterdir())
    plan.discard()
    # a run that is not replica groups keeps its policy on every engine
    plain = _plan(folder, recovery=policy)
    ftcheck.refuse_moves(plain.spec, "Slurm")
    plain.discard()
