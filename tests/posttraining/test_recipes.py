"""The Post-Training recipes (notebooks 04-07) executed with papermill against the real local
emulator: a daemon serving the Post-Training API over loopback HTTP, computing on the built-in tiny
model in torch, driven by the unmodified `together` SDK from the notebooks' kernel.

Nothing is faked. Each notebook writes what it measured to a JSON file (its ``results_path``
parameter); the tests read those files and the executed notebooks back. A fake ``TOGETHER_API_KEY``
is in the kernel's environment (``local=True`` keeps the notebooks on the emulator) so that the
tests can prove neither it nor the emulator's key leaks into an output.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

FAKE_KEY = "tgnb-fake-key-DO-NOT-LEAK-5678"

#: Short runs for CI (2 CPU cores). The GRPO run keeps 30 steps: the learning criterion compares
#: the first 10 with the last 10.
PARAMETERS: dict[str, dict[str, Any]] = {
    "pt-grpo": {"max_steps": 30},
    "multi-lora": {"max_steps": 8, "prompts_per_step": 4},
    "pt-dpo": {"max_steps": 12},
    "async-rl": {"max_steps": 6, "prompts_per_step": 4, "group_size": 4},
}


@dataclass
class Executed:
    home: Path
    out: Path
    results: dict[str, Any] = field(default_factory=dict)
    notebooks: dict[str, Path] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def result(self, name: str) -> Any:
        if name in self.errors:
            pytest.fail(f"notebook {name} failed: {self.errors[name]}")
        return self.results[name]


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executed]:
    from tgnb import batch
    from tgnb.emulator import daemon

    root = tmp_path_factory.mktemp("recipes")
    ex = Executed(home=root / "home", out=root / "out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TGNB_HOME", str(ex.home))
        mp.setenv("TOGETHER_API_KEY", FAKE_KEY)
        mp.delenv("TOGETHER_BASE_URL", raising=False)
        # no HF_HUB_OFFLINE: a recipe's tokenizer loads by the listed name with no Hub call, and
        # the test below checks the executed notebooks show no retries of the Hub
        mp.delenv("HF_HUB_OFFLINE", raising=False)
        mp.delenv("TRANSFORMERS_OFFLINE", raising=False)
        try:
            for name, params in PARAMETERS.items():
                path = root / f"{name}.json"
                extra = {"out_dir": str(ex.out / "adapter")} if name == "pt-grpo" else {}
                t0 = time.monotonic()
                try:
                    done = batch.run_notebook(
                        name,
                        ex.out,
                        {**params, "local": True, "results_path": str(path), **extra},
                        home=ex.home,
                        html=False,
                        cell_timeout=600,
                    )
                    ex.notebooks[name] = done.output
                    ex.results[name] = json.loads(path.read_text(encoding="utf-8"))
                except batch.NotebookError as exc:
                    ex.errors[name] = str(exc)
                    ex.notebooks[name] = exc.output
                finally:
                    ex.seconds[name] = time.monotonic() - t0
            print("recipe run times (s):", {k: round(v) for k, v in ex.seconds.items()})
            yield ex
        finally:
            daemon.stop(ex.home)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _outputs(path: Path, tag: str) -> str:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type == "code" and tag in cell.metadata.get("tags", []):
            for o in cell.get("outputs", []):
                out.append(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def _has_png(path: Path, tag: str) -> bool:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return any(
        "image/png" in o.get("data", {})
        for c in nb.cells
        if tag in c.metadata.get("tags", [])
        for o in c.get("outputs", [])
    )


def test_grpo_recipe_learns(executed: Executed) -> None:
    """Mean reward over the last 10 steps at least twice that of the first 10."""
    result = executed.result("pt-grpo")
    history = result["history"]
    assert len(history) == PARAMETERS["pt-grpo"]["max_steps"]
    first = _mean([h["reward"] for h in history[:10]])
    last = _mean([h["reward"] for h in history[-10:]])
    assert last >= 2 * first, f"mean reward {first:.3f} (first 10) -> {last:.3f} (last 10)"
    # the policy the Generator sampled advanced once per step (weights-sync after each optim-step)
    assert [h["policy_version"] for h in history] == list(range(1, len(history) + 1))
    assert _has_png(executed.notebooks["pt-grpo"], "plot")
    text = _outputs(executed.notebooks["pt-grpo"], "checkpoints")
    assert "adapter_model.safetensors" in text and "adapter_config.json" in text


def test_multi_lora_five_sessions_on_one_resource(executed: Executed) -> None:
    result = executed.result("multi-lora")
    histories = result["histories"]
    assert len(histories) == 5 and len(set(result["sessions"].values())) == 5
    for lr, h in histories.items():
        assert len(h) == PARAMETERS["multi-lora"]["max_steps"], lr
    # the runs trained independently: five learning rates, five different reward curves
    curves = {tuple(round(r["reward"], 6) for r in h) for h in histories.values()}
    assert len(curves) > 1
    assert result["shared_gpu_minutes"] > 0
    assert result["separate_gpu_minutes"] == pytest.approx(5 * result["shared_gpu_minutes"])
    assert 0 < result["compute_only_gpu_minutes"] < result["separate_gpu_minutes"]
    assert _has_png(executed.notebooks["multi-lora"], "plot")


def test_dpo_custom_loss_margin_rises(executed: Executed) -> None:
    history = executed.result("pt-dpo")["history"]
    assert len(history) == PARAMETERS["pt-dpo"]["max_steps"]
    # the first step's policy is the reference: margin 0, loss log 2
    assert history[0]["margin"] == pytest.approx(0.0, abs=1e-4)
    assert history[0]["loss"] == pytest.approx(0.6931, abs=1e-3)
    k = 4
    first = _mean([h["margin"] for h in history[:k]])
    last = _mean([h["margin"] for h in history[-k:]])
    assert last > first + 0.05, f"margin {first:.4f} -> {last:.4f}"
    assert history[-1]["loss"] < history[0]["loss"]
    assert _has_png(executed.notebooks["pt-dpo"], "plot")


def test_async_rl_trains_one_version_behind_and_draws_who_was_busy(executed: Executed) -> None:
    result = executed.result("async-rl")
    steps = PARAMETERS["async-rl"]["max_steps"]
    sync, ahead = result["synchronous"], result["asynchronous"]
    assert [h["lag"] for h in sync["history"]] == [0] * steps
    assert [h["lag"] for h in ahead["history"]] == [0] + [1] * (steps - 1)
    assert sync["overlap_seconds"] == 0.0
    assert result["ratio"] == pytest.approx(ahead["steps_per_minute"] / sync["steps_per_minute"])
    # the service's regime, modelled as bench/async_rl.py does: it replays the synchronous run,
    # and running ahead on two GPUs is faster than taking turns
    assert result["fits"][0] == pytest.approx(1.0, rel=0.05)
    assert result["modelled_ratio"] > 1.0
    assert _has_png(executed.notebooks["async-rl"], "plot")
    assert "asynchronous / synchronous" in _outputs(executed.notebooks["async-rl"], "summary")


def test_no_key_in_any_output(executed: Executed) -> None:
    """Neither the user's key (in the kernel's environment) nor the emulator's appears in the
    executed notebooks or the result files."""
    for name in PARAMETERS:
        executed.result(name)
    emulator_key = (executed.home / "emulator" / "api_key").read_text(encoding="utf-8").strip()
    assert emulator_key
    files = [p for p in executed.out.rglob("*") if p.is_file()]
    files += [p for p in executed.out.parent.glob("*.json")]
    assert len(files) >= 6
    for path in files:
        blob = path.read_bytes()
        assert FAKE_KEY.encode() not in blob, path
        assert emulator_key.encode() not in blob, path
    text = _outputs(executed.notebooks["pt-grpo"], "connect")
    assert re.search(r"local emulator", text), text


def test_no_hub_retry_wall_in_any_output(executed: Executed) -> None:
    """No HF_HUB_OFFLINE in the kernel and no network on this machine: had a recipe asked the Hub,
    huggingface_hub's retries ("Retrying in 1s [Retry 1/5]", a URL on huggingface.co) would be in
    its cells' stderr. Every output of every executed recipe is read, streams included."""
    import nbformat

    for name in PARAMETERS:
        executed.result(name)
        nb = nbformat.read(executed.notebooks[name], as_version=4)
        for cell in nb.cells:
            for o in cell.get("outputs", []):
                text = str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                assert "Retrying" not in text and "huggingface.co" not in text, (name, text)
