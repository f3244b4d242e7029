"""The real Tinker cookbook (``tinker-cookbook`` from PyPI, not an imitation), its modules
unchanged, run with ``python -m tgnb.tinker -m <recipe>`` on the emulator daemon over real HTTP
(the ``rl_emulator`` fixture) with the built-in tiny model:

- its supervised recipe (``recipes.chat_sl.train``, on the conversations file the cookbook ships:
  the recipe's own ``dataset=*.jsonl`` option, since its Hub datasets cannot load here), with
  periodic saves;
- its RL trainer (``rl/train.py``, through ``recipes.math_rl.train`` with ``env=arithmetic``,
  whose problems the cookbook generates itself), with periodic saves, on-policy and with
  ``max_steps_off_policy=1`` (the asynchronous trainer) and a KL penalty.

The cookbook's modules ``import tinker`` themselves; nothing of theirs is patched. Nothing is
faked. The cookbook is not a dependency of tgnb (it needs packages tgnb does not pin): the module
is skipped where it is not installed. 0.5.7 (written for Tinker 0.23) and 0.6.1 (for Tinker 0.38:
its sequence ids, provenance spans and ``record_stability_info``, which the layer answers) both
run here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
cookbook = pytest.importorskip(
    "tinker_cookbook", reason="the real Tinker cookbook: pip install tinker-cookbook"
)

pytestmark = pytest.mark.slow
MODEL = "tgnb/tiny-llama"
COMMON = [f"model_name={MODEL}", "renderer_name=role_colon", "lora_rank=8", "eval_every=0"]


def run_recipe(module: str, args: list[str], log_path: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tgnb.tinker -m <module> args...``: the recipe's own command line (or
    ``python -m tgnb.tinker <script> args...`` for a script's path)."""
    argv = [*COMMON, *args, f"log_path={log_path}", "behavior_if_log_dir_exists=delete"]
    entry = [module] if module.endswith(".py") else ["-m", module]
    proc = subprocess.run(
        [sys.executable, "-m", "tgnb.tinker", *entry, *argv],
        cwd=log_path.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_checkpoints_served(emu: EmulatorHandle, log_path: Path) -> list[dict[str, Any]]:
    """The cookbook's checkpoint log has periodic saves and the final one; every path in it is a
    checkpoint the emulator holds."""
    saved = jsonl(log_path / "checkpoints.jsonl")
    names = [s["name"] for s in saved]
    assert "final" in names and any(n != "final" for n in names), names
    checkpoints = emu.client().post_training.checkpoints
    for s in saved:
        for key in ("state_path", "sampler_path"):
            cid = s[key].rsplit("/", 1)[-1]  # tinker://<run>/<kind>/<checkpoint id>
            assert checkpoints.retrieve(cid).id == cid
    return saved


def test_cookbook_chat_sl_recipe(rl_emulator: EmulatorHandle, tmp_path: Path) -> None:
    """``recipes.chat_sl.train`` on the cookbook's ``example_data/conversations.jsonl``: 4 steps,
    a save every 2; the training NLL falls."""
    data = Path(cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    log_path = tmp_path / "sl"
    args = [f"dataset={data}", "max_length=256", "batch_size=8", "learning_rate=1e-3"]
    args += ["max_steps=4", "save_every=2", "infrequent_eval_every=0"]
    run_recipe("tinker_cookbook.recipes.chat_sl.train", args, log_path)
    nll = [m["train_mean_nll"] for m in jsonl(log_path / "metrics.jsonl")]
    assert len(nll) == 4 and nll[-1] < nll[0], nll
    assert_checkpoints_served(rl_emulator, log_path)


KL_ENTRY = """
# math_rl's own CLI, with the KL penalty's reference model set: the recipe passes
# kl_penalty_coef on but never kl_reference_config, which rl/train.py requires with it.
import asyncio

import chz
import tinker_cookbook.recipes.math_rl.train as recipe
from tinker_cookbook.rl.train import KLReferenceConfig

recipe_main = recipe.main


async def main(config):
    reference = KLReferenceConfig(base_model=config.model_name)
    await recipe_main(chz.replace(config, kl_reference_config=reference))


recipe.main = main
asyncio.run(recipe.cli_main(chz.entrypoint(recipe.CLIConfig)))
"""


@pytest.mark.parametrize("off_policy", [None, 1], ids=["on-policy", "off-policy-1-kl"])
def test_cookbook_rl_train_through_math_rl(
    rl_emulator: EmulatorHandle, tmp_path: Path, off_policy: int | None
) -> None:
    """The cookbook's ``rl/train.py`` through ``recipes.math_rl.train env=arithmetic``: 4 steps
    of groups of 4, a periodic save every 2 steps (then the sync ``create_sampling_client`` on
    the saved path, inside the trainer's event loop), on-policy, and one step off-policy with a
    KL penalty against the base model (through a four-line entry script: the recipe's CLI
    cannot set the reference model the penalty needs). ``loss_fn=importance_sampling``: 0.6's
    default, Tinker 0.38's ``stable_reinforce``, is not a Post-Training loss."""
    log_path = tmp_path / "rl"
    args = ["env=arithmetic", "group_size=4", "groups_per_batch=2", "max_tokens=5"]
    args += ["learning_rate=1e-3", "max_steps=4", "save_every=2", "loss_fn=importance_sampling"]
    module = "tinker_cookbook.recipes.math_rl.train"
    if off_policy is not None:
        args += [f"max_steps_off_policy={off_policy}", "kl_penalty_coef=0.1"]
        module = str(tmp_path / "math_rl_kl.py")
        Path(module).write_text(KL_ENTRY)
    proc = run_recipe(module, args, log_path)
    assert "Training completed successfully" in proc.stderr + proc.stdout
    metrics = jsonl(log_path / "metrics.jsonl")
    steps = [m for m in metrics if "env/all/reward/total" in m]  # 0.6 adds a final row
    assert steps, metrics
    if off_policy is not None:
        assert all("kl_policy_base" in m for m in steps), steps[0].keys()
    assert_checkpoints_served(rl_emulator, log_path)
