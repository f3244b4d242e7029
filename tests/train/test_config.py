"""Config loading, ``--set`` overrides, and every bad input as a one-line `TrainConfigError`.

Validation runs against the real TRL config classes (GRPOConfig/DPOConfig) and the checkpoint
engineer's real `latest_complete`; nothing is faked.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tgnb.errors import TrainConfigError
from tgnb.runs.policy import CheckpointPolicy
from tgnb.tasks import config as tc
from tgnb.train.validate import validate


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def one_line(exc: pytest.ExceptionInfo[TrainConfigError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg, msg
    return msg


def test_load_yaml_and_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        algorithm: grpo
        model: tiny
        rewards: [correctness]
        max_steps: 20
        trl: {learning_rate: 0.005, num_generations: 4}
        checkpoint: {every_steps: 10}
        """,
    )
    cfg = tc.load(
        path,
        [
            "trl.learning_rate=1e-3",
            "trl.beta=0.04",
            "max_steps=30",
            "checkpoint.keep_last=3",
            "rewards=[correctness, format]",
            "lora.r=4",
            "name=my run",
        ],
        run_dir=tmp_path / "r1",
    )
    assert cfg.max_steps == 30 and isinstance(cfg.max_steps, int)
    assert cfg.trl == {"learning_rate": 1e-3, "num_generations": 4, "beta": 0.04}
    assert isinstance(cfg.trl["learning_rate"], float)
    assert cfg.checkpoint == CheckpointPolicy(every_steps=10, keep_last=3)
    assert cfg.rewards == ["correctness", "format"]
    assert cfg.lora == {"r": 4}
    assert cfg.name == "my run"
    assert cfg.run_dir == str(tmp_path / "r1")
    assert cfg.dataset == "arithmetic"  # the algorithm's default
    validate(cfg)

    cfg.dump(tmp_path / "out" / "run.yaml")
    again = tc.load(tmp_path / "out" / "run.yaml")
    assert again == cfg
    assert (
        yaml.safe_load((tmp_path / "out" / "run.yaml").read_text())["checkpoint"]["keep_last"] == 3
    )


def test_defaults_follow_algorithm(tmp_path: Path) -> None:
    cfg = tc.load(None, ["algorithm=dpo"])
    assert cfg.dataset == "arithmetic-preference"
    assert cfg.run_dir is not None and cfg.run_dir.endswith("dpo-tiny")
    validate(cfg)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algorithm=grop"], "unknown algorithm 'grop'. Did you mean 'grpo'?"),
        (["rewards=[corectness]"], "unknown reward 'corectness'. Did you mean 'correctness'?"),
        (["dataset=arithmatic"], "unknown dataset 'arithmatic'. Did you mean 'arithmetic'"),
        (["dataset=/nowhere/rows.jsonl"], "does not exist"),
        (["dataset=/data/rows.txt"], "has suffix '.txt'"),
        (
            ["trl.learning_rte=0.1"],
            "unknown TRL option for GRPO 'learning_rte'. Did you mean 'learning_rate'",
        ),
        (
            ["algorithm=dpo", "trl.num_generations=4"],
            "unknown TRL option for DPO 'num_generations'",
        ),
        (["trl.output_dir=/tmp/x"], "set by the checkpoint guard"),
        (["trl.max_steps=5"], "set max_steps at the top level"),
        (["model=/no/such/model"], "model path '/no/such/model' does not exist"),
        (["model=./missing-model"], "model path './missing-model' does not exist"),
        (["rewards=[nosuchmodule_xyz:f]"], "cannot import module 'nosuchmodule_xyz'"),
        (["max_steps=0"], "max_steps must be at least 1"),
        (["checkpoint.every_steps=-1"], "checkpoint.every_steps must be at least 1"),
        (["checkpoint.keep_last=0"], "checkpoint.keep_last must be at least 1"),
        (["checkpoint.auto=maybe"], "checkpoint.auto must be true or false"),
        (["checkpoint.preemptions_per_hour=-1"], "checkpoint.preemptions_per_hour must be a num"),
        (["checkpoint.failures_per_hour=0"], "checkpoint.failures_per_hour must be a number above"),
        (["checkpoint.failures_per_hour=.nan"], "checkpoint.failures_per_hour must be a number"),
        (["checkpoint.drain_poll_seconds=abc"], "checkpoint.drain_poll_seconds must be a number"),
        (["checkpoint.every_seconds=-5"], "checkpoint.every_seconds must be a number"),
        (["lora.lora_alph=4"], "unknown LoRA option 'lora_alph'. Did you mean 'lora_alpha'"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, overrides: list[str], expected: str) -> None:
    """Refused as the config is read (the checkpoint policy checks itself when it is built) or
    when it is validated (what needs TRL, the data or the model)."""
    with pytest.raises(TrainConfigError) as exc:
        validate(tc.load(None, overrides, run_dir=tmp_path / "r"))
    assert expected in one_line(exc)


def test_trl_key_lists_close_matches(tmp_path: Path) -> None:
    cfg = tc.load(None, ["trl.num_generation=4"], run_dir=tmp_path / "r")
    with pytest.raises(TrainConfigError) as exc:
        validate(cfg)
    msg = one_line(exc)
    assert "'num_generations'" in msg and "Did you mean" in msg


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["max_step=5"], "unknown config key 'max_step'. Did you mean 'max_steps'?"),
        (
            ["checkpoint.every_step=5"],
            "unknown checkpoint key 'every_step'. Did you mean 'every_steps'",
        ),
        (["seed=abc"], "'seed' must be an integer"),
        (["trl=3"], "'trl' must be a mapping"),
    ],
)
def test_bad_keys_at_load(overrides: list[str], expected: str) -> None:
    with pytest.raises(TrainConfigError) as exc:
        tc.load(None, overrides)
    assert expected in one_line(exc)


def test_bad_override_and_file(tmp_path: Path) -> None:
    with pytest.raises(TrainConfigError, match="not key=value"):
        tc.load(None, ["max_steps"])
    with pytest.raises(TrainConfigError, match="does not exist"):
        tc.load(tmp_path / "nope.yaml")
    with pytest.raises(TrainConfigError, match="mapping"):
        tc.load(write(tmp_path, "- a\n- b\n"))


REWARDS_MODULE = """
def good(prompts, completions, **kwargs):
    return [1.0 for _ in completions]

def only_completions(completions, **kwargs):
    return [0.0 for _ in completions]

def no_kwargs(prompts, completions):
    return [0.0 for _ in completions]

def extra_required(prompts, completions, scale, **kwargs):
    return [0.0 for _ in completions]

def swapped(completions, answers, **kwargs):
    return [0.0 for _ in completions]

not_callable = 3
"""


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "tgnb_test_rewards_mod"
    (tmp_path / f"{name}.py").write_text(REWARDS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_reward_by_dotted_path(reward_module: str, tmp_path: Path) -> None:
    for fn in ("good", "only_completions"):
        cfg = tc.load(None, [f"rewards=['{reward_module}:{fn}', format]"], run_dir=tmp_path / "r")
        validate(cfg)


@pytest.mark.parametrize("fn", ["no_kwargs", "extra_required", "swapped"])
def test_reward_with_wrong_signature(reward_module: str, tmp_path: Path, fn: str) -> None:
    cfg = tc.load(None, [f"rewards=['{reward_module}:{fn}']"], run_dir=tmp_path / "r")
    with pytest.raises(TrainConfigError) as exc:
        validate(cfg)
    msg = one_line(exc)
    assert f"reward '{reward_module}:{fn}' has signature {fn}(" in msg
    assert "f(prompts, completions, **kwargs) -> list[float]" in msg


def test_reward_missing_or_not_callable(reward_module: str, tmp_path: Path) -> None:
    cfg = tc.load(None, [f"rewards=['{reward_module}:missing']"], run_dir=tmp_path / "r")
    with pytest.raises(TrainConfigError, match="has no 'missing'"):
        validate(cfg)
    cfg = tc.load(None, [f"rewards=['{reward_module}:not_callable']"], run_dir=tmp_path / "r")
    with pytest.raises(TrainConfigError, match="is not a function"):
        validate(cfg)


def test_max_steps_must_be_above_checkpoint_step(tmp_path: Path) -> None:
    """A sealed checkpoint made with the checkpoint engineer's own `write_marker` (a real,
    complete checkpoint directory as far as `latest_complete` is concerned)."""
    from tgnb.train.checkpoint import write_marker

    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "checkpoint-40"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    write_marker(ckpt, 40)
    for steps in (40, 12):
        cfg = tc.load(None, [f"max_steps={steps}"], run_dir=run_dir)
        with pytest.raises(TrainConfigError) as exc:
            validate(cfg)
        assert f"max_steps={steps} is not above step 40 of checkpoint 'checkpoint-40'" in one_line(
            exc
        )
    validate(tc.load(None, ["max_steps=41"], run_dir=run_dir))


def test_a_restart_after_the_last_step_is_finished_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preemption that lands after the final save requeues a finished run: on that restart a
    checkpoint at exactly max_steps means done (the CLI exits 0), not a bad config (exit 2, the
    run then ended failed); a first start with that run directory is still refused."""
    from tgnb.train.checkpoint import write_marker
    from tgnb.train.cli import main
    from tgnb.train.validate import RunFinished

    run_dir = tmp_path / "run"
    ckpt = run_dir / "checkpoints" / "checkpoint-40"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 64)
    write_marker(ckpt, 40)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.setenv("TGNB_RESTART_COUNT", "0")
    with pytest.raises(TrainConfigError):
        validate(tc.load(None, ["max_steps=40"], run_dir=run_dir))
    monkeypatch.setenv("TGNB_RESTART_COUNT", "2")
    with pytest.raises(RunFinished, match="already finished"):
        validate(tc.load(None, ["max_steps=40"], run_dir=run_dir))
    with pytest.raises(TrainConfigError):  # fewer steps than done: still the user's mistake
        validate(tc.load(None, ["max_steps=12"], run_dir=run_dir))
    config = tmp_path / "c.yaml"
    config.write_text("algorithm: grpo\nmax_steps: 40\n")
    assert main([str(config), "--run-dir", str(run_dir)]) == 0


def test_training_kwargs_defaults_and_overrides(tmp_path: Path) -> None:
    from tgnb.train import runner

    cfg = tc.load(None, ["max_steps=7", "seed=3"], run_dir=tmp_path / "r")
    kw = runner.training_kwargs(cfg, cuda=False)
    assert kw["use_cpu"] is True and kw["bf16"] is False and kw["report_to"] == "none"
    assert kw["logging_steps"] == 1 and kw["max_steps"] == 7 and kw["seed"] == 3
    assert kw["reward_weights"] == [1.0, 0.1] and kw["activation_checkpointing"] is False
    cfg = tc.load(
        None,
        ["rewards=[correctness]", "trl.learning_rate=1e-4", "trl.gradient_checkpointing=true"],
        run_dir=tmp_path / "r",
    )
    kw = runner.training_kwargs(cfg, cuda=True)
    assert "use_cpu" not in kw and "reward_weights" not in kw
    assert kw["learning_rate"] == 1e-4 and kw["gradient_checkpointing"] is True
    assert "activation_checkpointing" not in kw  # the user's choice is not shadowed
    big = tc.load(None, ["model=Qwen/Qwen2.5-0.5B"], run_dir=tmp_path / "r")
    kw = runner.training_kwargs(big, cuda=True)
    assert "learning_rate" not in kw and "num_generations" not in kw  # TRL's own defaults
    assert kw["activation_checkpointing"] is True  # TRL's default, under transformers' new name


def test_mixed_precision_on_a_node_without_a_gpu_is_off_with_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trl.bf16`` / ``trl.fp16`` on a CPU node failed there (each restart): off, said once."""
    from tgnb.train import runner

    for key in ("bf16", "fp16"):
        cfg = tc.load(None, [f"trl.{key}=true"], run_dir=tmp_path / "r")
        kw = runner.training_kwargs(cfg, cuda=False)
        assert kw[key] is False
        assert f"trl.{key}=true needs a GPU and this node has none" in capsys.readouterr().err
        assert runner.training_kwargs(cfg, cuda=True)[key] is True  # a GPU node keeps it
        assert capsys.readouterr().err == ""


def test_cli_check_prints_resolved_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tgnb.train import cli

    path = write(tmp_path, "algorithm: dpo\nmax_steps: 9\n")
    code = cli.main(
        [str(path), "--set", "trl.beta=0.2", "--run-dir", str(tmp_path / "r"), "--check"]
    )
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    resolved = yaml.safe_load(out)
    assert resolved["algorithm"] == "dpo" and resolved["max_steps"] == 9
    # trl: what the node passes to DPOConfig, tgnb's own defaults (CPU, tuned for tiny) included
    assert resolved["trl"]["beta"] == 0.2 and resolved["dataset"] == "arithmetic-preference"
    assert resolved["trl"]["learning_rate"] == 1e-3 and resolved["trl"]["max_length"] == 32
    assert resolved["trl"]["use_cpu"] is True and resolved["trl"]["max_steps"] == 9
    assert not (tmp_path / "r").exists()  # --check writes nothing

    code = cli.main([str(path), "--set", "trl.bta=0.2", "--check"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("tgnb train: unknown TRL option for DPO 'bta'. Did you mean 'beta'")
    assert err.count("\n") == 1


def test_model_missing_from_offline_cache_is_a_config_error(tmp_path: Path) -> None:
    """A Hugging Face id that is neither reachable (HF_HUB_OFFLINE=1) nor cached. In a fresh
    process: huggingface_hub reads HF_HUB_OFFLINE when it is first imported, which in a whole-suite
    run happened before this folder's conftest set it."""
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    sets = ["--set", "model=acme-lab/no-such-model", "--set", "max_steps=2"]
    out = subprocess.run(
        [sys.executable, "-m", "tgnb.train", *sets, "--run-dir", str(tmp_path / "r")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert "model 'acme-lab/no-such-model' could not be loaded" in lines[-1], lines[-3:]
