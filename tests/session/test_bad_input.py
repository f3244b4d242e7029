"""Bad input to `Session.launch` and `tgnb.attach`: a one-line typed error naming the fix, and
nothing submitted — no run in the run store, no run directory, no supervisor, and no request that
changes anything on the (real, loopback) emulator: its request log shows reads only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle
from tgnb.errors import NotFoundError, TrainConfigError, ValidationError
from tgnb.session import attach

from .conftest import make_session


def _writes(emu: EmulatorHandle) -> list[dict[str, Any]]:
    return [r for r in emu.requests() if r["method"] not in ("GET", "HEAD")]


def _nothing_submitted(emu: EmulatorHandle, home: Path) -> None:
    from tgnb.runs.store import RunStore

    assert _writes(emu) == []
    assert RunStore(home).list() == []
    assert not (home / "runs").exists()


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


@pytest.fixture
def idle(emu: EmulatorHandle, tmp_path: Path) -> Any:
    """A KUBERNETES-type demo cluster whose preemptible target is still 0."""
    session = make_session(tmp_path, target=0)
    emu.clear_requests()
    return session


def test_preemptible_work_while_the_target_is_zero(
    idle: Any, emu: EmulatorHandle, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError) as exc:
        idle.launch("grpo", max_steps=5)
    assert "session.scale(preemptible=8)" in _one_line(exc)
    with pytest.raises(ValidationError) as exc:
        idle.launch("dpo", nodes=2, max_steps=5)
    assert "session.scale(preemptible=16)" in _one_line(exc)
    _nothing_submitted(emu, tmp_path)


def test_resources_the_cluster_cannot_hold(idle: Any, emu: EmulatorHandle, tmp_path: Path) -> None:
    idle.scale(preemptible=16)  # two preemptible nodes of 8 GPUs, one standard node
    emu.clear_requests()
    with pytest.raises(ValidationError) as exc:
        idle.launch("grpo", nodes=3, max_steps=5)
    assert "session.scale(preemptible=24)" in _one_line(exc)
    with pytest.raises(ValidationError) as exc:
        idle.launch("grpo", gpus_per_node=16, max_steps=5)
    assert "gpus_per_node<=8" in _one_line(exc)
    with pytest.raises(ValidationError) as exc:
        idle.launch("grpo", preemptible=False, nodes=2, max_steps=5)
    assert "has 1" in _one_line(exc)
    with pytest.raises(ValidationError) as exc:
        idle.launch("grpo", nodes=0, max_steps=5)
    assert "nodes=1" in _one_line(exc)
    _nothing_submitted(emu, tmp_path)


def test_bad_config_name_and_duplicates(idle: Any, emu: EmulatorHandle, tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError) as exc:
        idle.launch("grpo", max_stpes=5)
    assert "max_steps" in _one_line(exc)
    with pytest.raises(ValidationError) as exc:
        idle.launch("grpo", name="Not_Valid", preemptible=False, max_steps=5)
    assert "not valid" in _one_line(exc)
    with pytest.raises(ValidationError) as exc:
        idle.launch(str(tmp_path / "missing.yaml"))
    assert "neither an algorithm" in _one_line(exc)
    _nothing_submitted(emu, tmp_path)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"lora": {"r": -1}}, "lora.r must be at least 1, not -1"),
        ({"lora": {"r": 0}}, "lora.r must be at least 1, not 0"),
        ({"lora": {"r": 8, "lora_dropout": 5}}, "lora.lora_dropout must be a number in [0, 1)"),
        ({"lora": {"r": 8, "lora_alpha": -16}}, "lora.lora_alpha must be a number above 0"),
        ({"model": "/etc"}, "model path '/etc' is a directory with no model in it"),
        (
            {"trl": {"model_init_kwargs": {"scale": [1.0, float("inf")]}}},
            "trl.model_init_kwargs.scale[1] must be a finite number, not inf",
        ),
        ({"checkpoint": {"every_seconds": 1e-9}}, "checkpoint.every_seconds must be a number"),
    ],
)
def test_values_the_node_would_refuse_are_refused_at_launch(
    idle: Any, emu: EmulatorHandle, tmp_path: Path, settings: dict[str, Any], said: str
) -> None:
    """Each failed on the node (peft, ``nn.Dropout``, ``from_pretrained``), at every restart;
    now one line at launch, nothing recorded."""
    with pytest.raises(TrainConfigError) as exc:
        idle.launch("dpo", preemptible=False, max_steps=5, **settings)
    assert said in _one_line(exc)
    _nothing_submitted(emu, tmp_path)


def test_a_misspelt_script_is_named_against_the_users_folder_with_a_guess(
    idle: Any, emu: EmulatorHandle, tmp_path: Path
) -> None:
    """Not against the private snapshot folder (``/tmp/tgnb-workdir-xxxx``) it was checked in."""
    wd = tmp_path / "project"
    (wd / "sub").mkdir(parents=True)
    (wd / "train.py").write_text("print('hi')\n")
    (wd / "sub" / "eval.py").write_text("print('hi')\n")
    for script, fix in [
        ("trian.py", "did you mean 'train.py'?"),
        ("sub/evl.py", "did you mean 'sub/eval.py'?"),
        ("other.py", "give the path of a script inside it"),
    ]:
        with pytest.raises(TrainConfigError) as exc:
            idle.launch(script, workdir=wd, preemptible=False)
        line = _one_line(exc)
        assert f"script {script!r} is not in the workdir {str(wd)!r}: {fix}" in line, line
        assert "tgnb-workdir-" not in line
    _nothing_submitted(emu, tmp_path)


def test_unknown_cluster(emu: EmulatorHandle, tmp_path: Path) -> None:
    make_session(tmp_path, target=0)
    emu.clear_requests()
    with pytest.raises(NotFoundError) as exc:
        attach("no-such-cluster", local=True, home=tmp_path)
    assert "tgnb-demo" in _one_line(exc)  # the message lists the clusters there are
    _nothing_submitted(emu, tmp_path)


def test_slurm_commands_missing(emu: EmulatorHandle, tmp_path: Path) -> None:
    """A Slurm-backed session on a machine without sbatch: the engine's preflight refuses the run
    before it is recorded (a PATH without Slurm's commands stands in for such a machine)."""
    from tgnb.backends.slurm.commands import CommandRunner
    from tgnb.errors import BackendError

    session = attach(
        local=True,
        home=tmp_path,
        cluster_type="SLURM",
        backend="slurm",
        runner=CommandRunner(path=str(tmp_path / "no-bin")),
    )
    session.scale(preemptible=8, wait=True, timeout=60, poll=0.2)
    emu.clear_requests()
    with pytest.raises(BackendError) as exc:
        session.launch("grpo", max_steps=5, gpus_per_node=0)
    assert "sbatch" in _one_line(exc)
    _nothing_submitted(emu, tmp_path)


def test_kubernetes_image_missing(emu: EmulatorHandle, tmp_path: Path) -> None:
    """A Kubernetes-backed session (the emulator's kubeconfig names no reachable API server, and
    none is contacted): a run without an image is refused before it is recorded."""
    session = attach(local=True, home=tmp_path, backend="kubernetes")
    session.scale(preemptible=8, wait=True, timeout=60, poll=0.2)
    emu.clear_requests()
    with pytest.raises(ValidationError) as exc:
        session.launch("grpo", max_steps=5)
    assert "image" in _one_line(exc)
    _nothing_submitted(emu, tmp_path)
