"""Golden-file tests of the rendered sbatch scripts.

Regenerate the golden files after an intended change with
``TGNB_UPDATE_GOLDEN=1 python -m pytest tests/backends/slurm/test_render.py`` and review the diff.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tgnb.backends.base import Resources, RunSpec, SecretRef
from tgnb.backends.slurm.render import RenderOptions, render_config, render_script
from tgnb.errors import ValidationError
from tgnb.runs.trainconfig import from_dict

GOLDEN = Path(__file__).parent / "golden"
TRAIN = {
    "algorithm": "grpo",
    "model": "tiny",
    "dataset": "arithmetic",
    "max_steps": 40,
    "checkpoint": {"every_steps": 5},
}
SECRET_VALUE = "hf_do-not-leak-0123456789"

CASES = {
    "single_node_preemptible": RunSpec(
        name="grpo-tiny",
        train=TRAIN,
        resources=Resources(nodes=1, gpus_per_node=1, preemptible=True),
        env={"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"},
        secrets={"HF_TOKEN": SecretRef(name="hf-token", env="HF_TOKEN")},
        run_dir="/data/home/alice/tgnb-runs/grpo-tiny",
    ),
    "elastic_multi_node": RunSpec(
        name="grpo-elastic",
        train=TRAIN,
        resources=Resources(nodes=4, min_nodes=2, gpus_per_node=8, preemptible=True),
        secrets={"HF_TOKEN": SecretRef(name="hf-token", env="MY_HF_TOKEN")},
        run_dir="/data/home/alice/tgnb-runs/grpo-elastic",
    ),
    "standard_partition_account_time": RunSpec(
        name="dpo-standard",
        train={**TRAIN, "algorithm": "dpo"},
        resources=Resources(nodes=1, gpus_per_node=8, preemptible=False, cpus_per_task=16),
        partition="batch",
        account="research",
        time_limit="04:00:00",
        run_dir="/data/home/alice/tgnb-runs/dpo-standard",
    ),
    # one array task per replica group (tgnb.backends.slurm.groups), each a one-node torchrun
    "torchft_replica_groups": RunSpec(
        name="ft-groups",
        train={"script": "train.py", "fault_tolerance": "torchft"},
        resources=Resources(nodes=3, gpus_per_node=8, preemptible=True),
        secrets={"HF_TOKEN": SecretRef(name="hf-token", env="HF_TOKEN")},
        run_dir="/data/home/alice/tgnb-runs/ft-groups",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case: str) -> None:
    spec = CASES[case]
    assert spec.run_dir is not None
    script = render_script(spec, spec.run_dir)
    path = GOLDEN / f"{case}.sbatch"
    if os.environ.get("TGNB_UPDATE_GOLDEN"):
        path.write_text(script, encoding="utf-8")
    assert script == path.read_text(encoding="utf-8"), (
        f"regenerate with TGNB_UPDATE_GOLDEN=1: {path}"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_script_is_valid_bash_and_holds_no_secret(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET_VALUE)
    monkeypatch.setenv("MY_HF_TOKEN", SECRET_VALUE)
    spec = CASES[case]
    assert spec.run_dir is not None
    script = render_script(spec, spec.run_dir)
    assert SECRET_VALUE not in script
    assert SECRET_VALUE not in render_config(spec)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_directives_follow_the_seed() -> None:
    single = render_script(CASES["single_node_preemptible"], "/runs/a")
    assert "#SBATCH --constraint=preemptible" in single
    assert "#SBATCH --requeue" in single
    assert "#SBATCH --open-mode=append" in single
    assert "#SBATCH --gres=gpu:1" in single
    assert "srun --kill-on-bad-exit=1 python -m tgnb.train" in single
    assert "torchrun" not in single

    elastic = render_script(CASES["elastic_multi_node"], "/runs/b")
    assert "#SBATCH --nodes=2-4" in elastic
    assert '--rdzv_id="$SLURM_JOB_ID"' in elastic
    assert "--rdzv_backend=c10d" in elastic
    assert '--rdzv_endpoint="$MASTER_ADDR:29500"' in elastic
    assert "--nproc_per_node=8" in elastic

    standard = render_script(CASES["standard_partition_account_time"], "/runs/c")
    assert "constraint" not in standard
    for line in ("--partition=batch", "--account=research", "--time=04:00:00"):
        assert f"#SBATCH {line}" in standard


def test_gres_can_be_turned_off_for_cpu_clusters() -> None:
    script = render_script(CASES["elastic_multi_node"], "/runs/b", RenderOptions(gres=False))
    assert "--gres" not in script
    assert "--nproc_per_node=8" in script


def test_run_dir_is_stable_and_config_round_trips() -> None:
    spec = CASES["single_node_preemptible"]
    assert render_script(spec, "/runs/x") == render_script(spec, "/runs/x")
    node = {**yaml.safe_load(render_config(spec)), "run_dir": spec.train.run_dir}  # its --run-dir
    assert from_dict(node) == spec.train  # the node's own reading


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"time_limit": "four hours"}, "not a Slurm time"),
        ({"partition": "low;rm -rf /"}, "partition"),
        ({"env": {"BAD-NAME": "1"}}, "environment variable"),
        ({"name": "Bad_Name"}, "run name"),
    ],
)
def test_bad_input_is_one_line_validation_error(change: dict[str, object], match: str) -> None:
    """Refused by the spec as it is built (name, env) or by the renderer (Slurm's own fields)."""
    fields = {"name": "ok", "train": TRAIN, **change}
    with pytest.raises(ValidationError, match=match) as err:
        render_script(RunSpec(**fields), "/runs/ok")  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_relative_run_dir_is_refused() -> None:
    with pytest.raises(ValidationError, match="absolute"):
        render_script(CASES["single_node_preemptible"], "runs/x")


def test_backend_run_dir_from_spec_or_name(tmp_path: Path) -> None:
    from tgnb.backends.slurm import SlurmBackend

    backend = SlurmBackend(runs_root=tmp_path, gres=False)
    assert backend.run_dir_for("abc") == f"{tmp_path}/abc"
    assert (
        backend.run_dir_for(CASES["elastic_multi_node"])
        == "/data/home/alice/tgnb-runs/grpo-elastic"
    )
    spec = RunSpec(name="abc", train=TRAIN)
    script, config = backend.render(spec)
    assert f"#SBATCH --chdir={tmp_path}/abc" in script
    assert from_dict(yaml.safe_load(config)) == spec.train
