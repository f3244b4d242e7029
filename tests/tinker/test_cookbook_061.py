"""The Tinker cookbook 0.6.1 as pip installs it (issue 46 §3), on the emulator daemon over real
HTTP (the ``rl_emulator`` fixture), with the built-in tiny model:

- its RL trainer (``rl/train.py`` through ``recipes.math_rl.train env=arithmetic``) with its
  default loss, Tinker 0.38's ``stable_reinforce`` (no ``loss_fn=`` given), and asynchronously
  (``max_steps_off_policy``);
- its tutorials (marimo notebooks, run as scripts with ``python -m tgnb.tinker <notebook>.py``),
  unchanged but for the model (the tiny model's name for every Hub model id) and the renderer
  (``role_colon`` for every renderer name). Each runs to its end, or stops with the one line that
  docs/tinker.md gives for it (``STOPS`` below).

The tutorials ship in the cookbook's source distribution, not its wheel: the test reads them from
``$TGNB_COOKBOOK_TUTORIALS`` (a ``tutorials/`` folder) or fetches the installed version's sdist
with pip. Skipped where tinker-cookbook 0.6.x is not installed (the CI's newer-tinker venv has
it). Nothing of the cookbook's is patched; nothing is faked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
cookbook = pytest.importorskip(
    "tinker_cookbook", reason="the real Tinker cookbook: pip install tinker-cookbook==0.6.1"
)
VERSION = getattr(cookbook, "__version__", "")
if not VERSION.startswith("0.6."):
    pytest.skip(f"tinker-cookbook 0.6.x, not {VERSION!r}", allow_module_level=True)

pytestmark = pytest.mark.slow
MODEL = "tgnb/tiny-llama"
RENDERER = "role_colon"
COMMON = [f"model_name={MODEL}", f"renderer_name={RENDERER}", "lora_rank=8", "eval_every=0"]

#: Hub model ids the tutorials name (string literals): each becomes the tiny model.
MODEL_ID = re.compile(r"([\"'])(?:Qwen|moonshotai|meta-llama|deepseek-ai|nvidia)/[\w.-]+\1")
#: Renderer names the tutorials pass (string literals): each becomes ``role_colon``.
RENDERER_NAME = re.compile(
    r"([\"'])(?:qwen3\w*|kimi_\w+|llama3\w*|deepseekv3\w*|gpt_oss\w*|nemotron\w*)\1"
)
RECOMMENDED = re.compile(r"(?:model_info\.)?get_recommended_renderer_name\([^()]*\)")


def tutorial_as_run_here(source: str) -> str:
    """The tutorial's text with its model and renderer changed, and nothing else."""
    source = MODEL_ID.sub(f'"{MODEL}"', source)
    source = RENDERER_NAME.sub(f'"{RENDERER}"', source)
    return RECOMMENDED.sub(f'"{RENDERER}"', source)


def tutorials_dir(tmp: Path) -> Path:
    """The installed cookbook's tutorials: ``$TGNB_COOKBOOK_TUTORIALS``, or its sdist's."""
    given = os.environ.get("TGNB_COOKBOOK_TUTORIALS")
    if given:
        return Path(given)
    spec = f"tinker-cookbook=={VERSION}"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    proc = subprocess.run([*pip, "-d", str(tmp), spec], capture_output=True, text=True)
    sdists = sorted(tmp.glob("tinker_cookbook-*.tar.gz"))
    if proc.returncode != 0 or not sdists:
        pytest.skip(
            f"the cookbook's sdist (its tutorials) could not be fetched: {proc.stderr[-300:]}"
        )
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(tmp, filter="data")
    return next(tmp.glob("tinker_cookbook-*/tutorials"))


@pytest.fixture(scope="module")
def tutorials(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tutorials_dir(tmp_path_factory.mktemp("cookbook-sdist"))


def tutorial_names() -> list[str]:
    """Collected from the names 0.6.1's sdist ships (kept here, so collection fetches nothing)."""
    return [
        "101_hello_tinker",
        "102_first_sft",
        "103_async_patterns",
        "104_first_rl",
        "201_rendering",
        "202_loss_functions",
        "203_completers",
        "204_evaluations",
        "301_cookbook_abstractions",
        "302_custom_environment",
        "303_sft_with_config",
        "304_rl_with_config",
        "401_sl_hyperparams",
        "402_rl_hyperparams",
        "403_dpo_preferences",
        "404_sequence_extension",
        "405_multi_agent",
        "406_prompt_distillation",
        "407_rlhf_pipeline",
        "501_export_hf",
        "502_lora_adapter",
        "503_publish_hub",
    ]


#: Tutorials that stop, each with the last line it ends on (a substring), and why (docs/tinker.md).
STOPS = {
    # its RL data set is the Hub's openai/gsm8k, and this machine (and CI's) has no Hub
    "104_first_rl": "Couldn't reach 'openai/gsm8k' on the Hub",
    # its SFT stage's data set is the Hub's HuggingFaceH4/no_robots
    "407_rlhf_pipeline": "Couldn't reach 'HuggingFaceH4/no_robots' on the Hub",
}
#: Tutorials run with nothing changed: 401 only reads the cookbook's table of LoRA sizes by the
#: model's name (``get_lora_param_count``), which knows no tiny model; it loads and calls nothing.
UNCHANGED = {"401_sl_hyperparams"}


def last_line(stderr: str) -> str:
    """The line a program stopped on: stderr's last, before the layer's closing cost line."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    while lines and lines[-1].startswith("tgnb.tinker: this script held"):
        lines.pop()
    return lines[-1] if lines else ""


def run(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tgnb.tinker", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: A tutorial's cells that call Tinker wait for this (``mo.stop``, silently, without it).
KEY_GATE = '"TINKER_API_KEY" not in os.environ'


@pytest.mark.parametrize("name", tutorial_names())
def test_cookbook_tutorial_as_script(
    rl_emulator: EmulatorHandle,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tutorials: Path,
    name: str,
) -> None:
    """The tutorial runs to its end (or stops with its line in `STOPS`); one that calls Tinker
    made requests to the emulator (a cell stopped by its key gate would pass silently)."""
    source = tutorials / f"{name}.py"
    script = tmp_path / source.name
    text = source.read_text()
    script.write_text(text if name in UNCHANGED else tutorial_as_run_here(text))
    monkeypatch.setenv("TINKER_API_KEY", rl_emulator.api_key)  # what its gate asks for
    # The cookbook's runs folder (~/tinker-runs): a rerun would resume, or refuse to overwrite,
    # what an earlier run (against another emulator) left there.
    monkeypatch.setenv("TINKER_COOKBOOK_RUNS_DIR", str(tmp_path / "tinker-runs"))
    rl_emulator.clear_requests()
    proc = run([str(script)], cwd=tmp_path)
    last = last_line(proc.stderr)
    if name in STOPS:
        assert proc.returncode != 0 and STOPS[name] in last, proc.stderr[-4000:]
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    if KEY_GATE in text:
        assert rl_emulator.requests(), f"{name} made no request: a cell stopped"


def jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


#: The RL trainer's default loss stops at its first sampler, with Post-Training's reason.
STABLE_REINFORCE_STOP = (
    "NotImplementedError: record_stability_info=True records what Tinker's stable_reinforce "
    "loss trains on, which Post-Training does not serve"
)


def run_math_rl(tmp_path: Path, args: list[str]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``recipes.math_rl.train env=arithmetic``: steps of 2 groups of 4, 5 tokens each."""
    log_path = tmp_path / "rl"
    argv = [*COMMON, "env=arithmetic", "group_size=4", "groups_per_batch=2", "max_tokens=5"]
    argv += ["learning_rate=1e-3", f"log_path={log_path}", "behavior_if_log_dir_exists=delete"]
    proc = run(["-m", "tinker_cookbook.recipes.math_rl.train", *argv, *args], cwd=tmp_path)
    return proc, log_path


@pytest.mark.parametrize("args", [[], ["max_steps_off_policy=2"]], ids=["sync", "async"])
def test_cookbook_rl_default_loss_stops_with_why(
    rl_emulator: EmulatorHandle, tmp_path: Path, args: list[str]
) -> None:
    """No ``loss_fn=``: the RL trainer's default, ``stable_reinforce`` (sync and async), asks its
    sampler for ``record_stability_info=True``; the run stops there, its last line the reason."""
    proc, _ = run_math_rl(tmp_path, ["max_steps=2", *args])
    last = last_line(proc.stderr)
    assert proc.returncode != 0 and last.startswith(STABLE_REINFORCE_STOP), proc.stderr[-3000:]


def test_cookbook_async_rl_ppo(rl_emulator: EmulatorHandle, tmp_path: Path) -> None:
    """The cookbook's async RL trainer (``max_steps_off_policy=2``: sampling up to two steps ahead
    of training) with the loss its docs advise for stale data, ``ppo``: 3 steps, each logged."""
    args = ["max_steps=3", "max_steps_off_policy=2", "loss_fn=ppo"]
    proc, log_path = run_math_rl(tmp_path, args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    steps = [m for m in jsonl(log_path / "metrics.jsonl") if "env/all/reward/total" in m]
    assert len(steps) == 3, steps


DPO_ENTRY = """
# The DPO recipe's own CLI, its dataset= a local comparisons file (the recipe's CLI names only
# Hub datasets, which cannot load here): the cookbook's ComparisonBuilderFromJsonl reads it.
import sys

import chz
import tinker_cookbook.recipes.preference.dpo.train as recipe
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonBuilderFromJsonl
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


def get_dataset_builder(dataset, model_name, renderer_name, max_length, batch_size):
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model_name,
        renderer_name=renderer_name,
        max_length=max_length,
        batch_size=batch_size,
    )
    comparisons = ComparisonBuilderFromJsonl(train_path=dataset)
    return DPODatasetBuilderFromComparisons(common_config=common, comparison_builder=comparisons)


recipe.get_dataset_builder = get_dataset_builder
recipe.cli_main(chz.entrypoint(recipe.CLIConfig))
"""


def comparisons_file(path: Path, n: int = 8) -> Path:
    """`n` labelled comparisons (the cookbook's JSONL form): B, a sum's right answer, preferred."""
    rows = []
    for i in range(n):
        a, b = i + 2, 3 * i + 1
        comparison = {
            "prompt_conversation": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "completion_A": [{"role": "assistant", "content": f"{a + b + 1}"}],
            "completion_B": [{"role": "assistant", "content": f"{a + b}"}],
        }
        rows.append(json.dumps({"comparison": comparison, "label": "B"}))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cookbook_dpo_recipe(rl_emulator: EmulatorHandle, tmp_path: Path) -> None:
    """``recipes.preference.dpo.train`` on 8 local comparisons, batches of 4: 2 steps against the
    base model as reference; the DPO loss is logged each step and starts at log 2."""
    entry = tmp_path / "dpo_local.py"
    entry.write_text(DPO_ENTRY)
    data = comparisons_file(tmp_path / "comparisons.jsonl")
    log_path = tmp_path / "dpo"
    args = [f"model_name={MODEL}", f"renderer_name={RENDERER}", f"dataset={data}"]
    args += ["batch_size=4", "max_length=128", "learning_rate=1e-3", "max_steps=2"]
    args += [f"log_path={log_path}", "behavior_if_log_dir_exists=delete"]
    proc = run([str(entry), *args], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [m for m in jsonl(log_path / "metrics.jsonl") if "dpo_loss" in m]
    assert len(rows) == 2, rows
    assert abs(float(rows[0]["dpo_loss"]) - 0.6931) < 0.01, rows[0]  # type: ignore[arg-type]
