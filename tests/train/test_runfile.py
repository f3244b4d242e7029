"""The run file (`tgnb.runs.runfile`, ``run.json``): the one typed file an engine writes per submit,
read once by the node (``python -m tgnb.train run.json``), which trusts what the launch checked;
``config.yaml`` and ``$TGNB_CHECKPOINT`` are views of it. Real files, real subprocesses."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tgnb.backends.base import Resources, RunSpec, SecretRef
from tgnb.errors import TrainConfigError, ValidationError
from tgnb.prices import Prices
from tgnb.runs import node
from tgnb.runs.budget import Budget
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.runfile import PlacerConfig, RunFile
from tgnb.runs.spec import SCHEMA
from tgnb.tasks import config
from tgnb.train.cli import node_config
from tgnb.train.program import environment

SPEC = RunSpec(
    name="sft-a",
    train={"algorithm": "sft", "max_steps": 9, "lora": {"r": 4}, "checkpoint": {"every_steps": 3}},
    resources=Resources(nodes=2, min_nodes=1, gpus_per_node=4),
    env={"A": "1"},
    secrets={"HF_TOKEN": SecretRef(name="hf", env="HF_TOKEN")},
    budget_usd=5.0,
    prices=Prices(2.5, 1.2),
)


def test_one_schema_and_the_spec_as_the_launch_validated_it(tmp_path: Path) -> None:
    run = RunFile(SPEC, 1.8e9)
    data = json.loads(run.to_json())
    assert data["schema"] == SCHEMA and data["launched"] == 1.8e9
    assert "schema" not in data["spec"] and "run_dir" not in data["spec"]["train"]
    (tmp_path / node.RUN_FILE).write_text(run.to_json())
    back = RunFile.load(tmp_path / node.RUN_FILE)
    assert back.spec.resources == SPEC.resources and back.spec.secrets == SPEC.secrets
    assert back.train.lora == {"r": 4} and back.train.checkpoint == SPEC.train.checkpoint
    assert back.budget() == Budget.of(SPEC)  # the budget the node holds, from the same file


def test_a_run_file_without_a_schema_still_loads() -> None:
    old = {"launched": 1.8e9, "spec": {"name": "r", "train": {"max_steps": 7}}}
    assert RunFile.from_dict(old).train.max_steps == 7


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "is not one tgnb wrote"),
        ('{"schema": 99, "launched": 1, "spec": {"name": "r"}}', "newer than this tgnb reads"),
        ('{"schema": 1, "spec": {"name": "r"}}', "'launched' must be epoch seconds"),
    ],
)
def test_a_bad_run_file_is_one_line_naming_the_fix(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / node.RUN_FILE
    path.write_text(text)
    with pytest.raises(TrainConfigError, match=expected) as info:
        RunFile.load(path)
    assert "\n" not in str(info.value)


def test_the_node_reads_the_run_file_once_and_the_views_agree(tmp_path: Path) -> None:
    run = RunFile(SPEC, 1.8e9)
    (tmp_path / node.RUN_FILE).write_text(run.to_json())
    (tmp_path / node.CONFIG).write_text(run.config_yaml())
    cfg, read = node_config(str(tmp_path / node.RUN_FILE), [], "/data/runs/sft-a")
    assert read is not None and read.to_json() == run.to_json()
    assert cfg.run_dir == "/data/runs/sft-a"
    from_yaml = config.load(tmp_path / node.CONFIG, [], "/data/runs/sft-a")  # the view
    assert cfg == from_yaml
    checkpoint = json.loads(environment(cfg)[node.CHECKPOINT_ENV])  # what the program is given
    assert checkpoint["every_steps"] == 3 == SPEC.train.checkpoint.every_steps
    again, trusted = node_config(str(tmp_path / node.CONFIG), [], "/data/runs/sft-a")
    assert again == cfg and trusted is None  # a person's YAML is checked in full
    changed, trusted = node_config(str(tmp_path / node.RUN_FILE), ["max_steps=12"], None)
    assert changed.max_steps == 12 and trusted is None  # a --set makes a new config


def test_both_placers_read_one_schema_derived_from_the_run_file() -> None:
    """``placer.json`` on Slurm and Kubernetes: the run file's `placer_config` (one schema, its
    version), with each engine's own keys only."""
    from tgnb.backends.kubernetes.placer_objects import placer_config
    from tgnb.backends.slurm.placer import render_placer

    spec = RunSpec("p", {"max_steps": 40}, Resources(nodes=2, min_nodes=1), partition="low",
                   recovery=RecoveryPolicy(when_short="standard"))  # fmt: skip
    view = RunFile(spec, 1.8e9).placer_config(5.0).to_dict()
    assert view["schema"] == SCHEMA and view["max_steps"] == 40 and view["launched"] == 1.8e9
    slurm = json.loads(render_placer(spec, "/data/runs/p", "python3", 1.8e9)[1])
    kube = json.loads(placer_config(spec, "research", 1.8e9))
    assert {k: v for k, v in slurm.items() if k not in ("cpus_per_task", "partition")} == view
    assert (slurm["partition"], slurm["cpus_per_task"]) == ("low", 1)
    assert {
        k: v for k, v in kube.items() if k not in ("namespace", "run_dir", "deployment")
    } == view


def test_placer_json_loads_typed_old_ones_too_and_a_newer_one_is_refused(tmp_path: Path) -> None:
    """Both placers load ``placer.json`` as a `PlacerConfig`: what was written reads back equal;
    one written before the ``schema`` key reads the same; a newer schema or a key no tgnb writes
    is refused in one line naming the fix."""
    from tgnb.backends.slurm.placer import render_placer

    spec = RunSpec("p", {"max_steps": 40}, Resources(nodes=2, min_nodes=1), partition="low",
                   recovery=RecoveryPolicy(when_short="standard", wait_s=30))  # fmt: skip
    written = RunFile(spec, 1.8e9).placer_config(2.5, cpus_per_task=1, partition="low")
    (tmp_path / "placer.json").write_text(render_placer(spec, "/r", "python3", 1.8e9, 2.5)[1])
    loaded = PlacerConfig.load(tmp_path / "placer.json")
    assert loaded == written and loaded.policy.wait_s == 30 and loaded.partition == "low"
    old = {k: v for k, v in written.to_dict().items() if k != "schema"}
    assert PlacerConfig.from_dict(old) == dataclasses.replace(written, schema=0)
    with pytest.raises(ValidationError, match="upgrade tgnb"):
        PlacerConfig.from_dict({**old, "schema": SCHEMA + 1})
    with pytest.raises(ValidationError, match="unknown key 'gpus'"):
        PlacerConfig.from_dict({**old, "gpus": 8})
    with pytest.raises(ValidationError, match="no 'policy'"):
        PlacerConfig.from_dict({k: v for k, v in old.items() if k != "policy"})


def _train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "tgnb.train", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_persons_config_is_checked_in_full(tmp_path: Path) -> None:
    """``tgnb train config.yaml``: the launch's light checks are made (a model path that is not
    there is refused, exit 2, one line)."""
    (tmp_path / "config.yaml").write_text("algorithm: grpo\nmodel: ./no-such-model\n")
    proc = _train("config.yaml", "--run-dir", str(tmp_path / "r"), "--check", cwd=tmp_path)
    assert proc.returncode == int(node.Exit.BAD_CONFIG), proc.stderr
    assert "model path './no-such-model' does not exist" in proc.stderr


@pytest.mark.slow
def test_the_node_trusts_what_the_launch_checked(tmp_path: Path) -> None:
    """The same config from a run file: the launch checked the model path where it was (the
    launching machine), so the node does not check it again; it still makes the checks only it
    can (TRL's option names: a typo is refused there)."""
    spec = RunSpec("grpo-a", {"algorithm": "grpo", "model": "./no-such-model"})
    (tmp_path / node.RUN_FILE).write_text(RunFile(spec, 1.8e9).to_json())
    proc = _train(node.RUN_FILE, "--run-dir", str(tmp_path / "r"), "--check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "model: ./no-such-model" in proc.stdout
    typo = RunSpec("grpo-a", {"algorithm": "grpo", "trl": {"learning_rat": 1e-3}})
    (tmp_path / node.RUN_FILE).write_text(RunFile(typo, 1.8e9).to_json())
    proc = _train(node.RUN_FILE, "--run-dir", str(tmp_path / "r"), "--check", cwd=tmp_path)
    assert proc.returncode == int(node.Exit.BAD_CONFIG), proc.stderr
    assert "unknown TRL option for GRPO 'learning_rat'" in proc.stderr


def test_protect_reads_the_policy_from_the_run_file_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`protect`'s policy under tgnb: the run file's, loaded typed, over the program's own; the
    ``$TGNB_CHECKPOINT`` view is read only where no run file is named (a job rendered before,
    whose script pointed ``$TGNB_CONFIG`` at ``config.yaml``)."""
    from tgnb.train.protect import run_context

    (tmp_path / node.RUN_FILE).write_text(RunFile(SPEC, 1.8e9).to_json())
    (tmp_path / node.CONFIG).write_text(RunFile(SPEC, 1.8e9).config_yaml())
    cfg, _ = node_config(str(tmp_path / node.RUN_FILE), [], str(tmp_path))
    env = environment(cfg, str(tmp_path / node.RUN_FILE))
    assert env[node.RUN_FILE_ENV] == str(tmp_path / node.RUN_FILE)
    monkeypatch.setenv(node.RUN_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(node.CHECKPOINT_ENV, '{"every_steps": 11}')  # differs: not read
    monkeypatch.setenv(node.RUN_FILE_ENV, env[node.RUN_FILE_ENV])
    ctx = run_context(None, {"every_steps": 50, "keep_last": 1})
    assert ctx.managed and ctx.policy == SPEC.train.checkpoint and ctx.policy.every_steps == 3
    monkeypatch.setenv(node.RUN_FILE_ENV, str(tmp_path / node.CONFIG))  # a job rendered before
    assert run_context(None, {"keep_last": 1}).policy.every_steps == 11
    monkeypatch.setenv(node.RUN_FILE_ENV, str(tmp_path / "gone" / node.RUN_FILE))
    with pytest.raises(TrainConfigError, match="cannot be read"):
        run_context(None)


@pytest.mark.training
def test_a_program_on_the_node_gets_its_policy_from_the_run_file(tmp_path: Path) -> None:
    """``python -m tgnb.train run.json`` running a script: the script is pointed at the run file
    (an absolute path, though it runs in its workdir) and `protect`'s policy comes from there,
    with ``$TGNB_CHECKPOINT`` gone; a ``--set`` makes a config no run file holds: none named."""
    script = (
        "import os\nos.environ.pop('TGNB_CHECKPOINT')\n"
        "from tgnb.train.protect import run_context\n"
        "print('every', run_context(None).policy.every_steps, os.environ.get('TGNB_CONFIG'))\n"
    )
    run_dir = tmp_path / "r"
    (run_dir / node.WORKDIR).mkdir(parents=True)
    (run_dir / node.WORKDIR / "p.py").write_text(script)
    spec = RunSpec("s", {"algorithm": "script", "script": "p.py", "checkpoint": {"every_steps": 7}})
    (tmp_path / node.RUN_FILE).write_text(RunFile(spec, 1.8e9).to_json())
    proc = _train(node.RUN_FILE, "--run-dir", str(run_dir), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"every 7 {tmp_path / node.RUN_FILE}" in proc.stdout
    proc = _train(node.RUN_FILE, "--run-dir", str(run_dir), "--set", "seed=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "every None None" in proc.stdout  # the defaults: nothing names the launch's policy
