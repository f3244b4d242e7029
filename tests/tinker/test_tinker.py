"""The Tinker example (examples/tinker_rl.py) run unchanged against the real local emulator:
``tinker==0.23.1`` and tgnb's Tinker layer (``tgnb.tinker``, as docs/tinker.md says) in a subprocess, with only
``TOGETHER_BASE_URL`` and ``TOGETHER_API_KEY`` pointing at a daemon started under the test's
tmp_path. Nothing is faked; needs the ``tinker`` extra (``pip install '.[tinker]'``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tinker_rl.py"


def test_example_differs_from_a_tinker_script_only_by_its_import() -> None:
    """With its one Together import replaced by ``import tinker``, the script is a Tinker script:
    it imports nothing else from Together or tgnb, and uses ``tinker`` the Tinker way."""
    source = EXAMPLE.read_text(encoding="utf-8")
    code = source.split('"""', 2)[2]  # past the module docstring
    lines = [ln for ln in code.splitlines() if re.match(r"\s*(import|from)\s+(together|tgnb)", ln)]
    assert lines == [
        "import tgnb.tinker as tinker  # the one line that differs from a Tinker script"
    ]
    compile(code.replace(lines[0], "import tinker"), str(EXAMPLE), "exec")


@pytest.mark.slow
def test_tinker_rl_loop_learns_on_the_emulator(tmp_path: Path) -> None:
    pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
    from tgnb.emulator import daemon

    home = tmp_path / "home"
    st, _ = daemon.start(home, daemon.ServeOptions.of(time_scale=0.02))
    try:
        assert st.base_url and st.api_key
        env = {  # no HF_HUB_OFFLINE: the listed name's tokenizer loads with no Hub call
            k: v
            for k, v in os.environ.items()
            if k not in ("TOGETHER_API_KEY", "TGNB_HOME", "HF_HUB_OFFLINE")
        }
        env.update(
            TOGETHER_BASE_URL=st.base_url,
            TOGETHER_API_KEY=st.api_key.get(),
            PYTHONPATH=str(EXAMPLE.parents[1]),
        )
        from together import Together

        models = Together(api_key=st.api_key.get(), base_url=st.base_url)
        model = models.post_training.supported_models.get().data[0].base_model
        out = tmp_path / "history.json"
        steps = 24
        argv = [sys.executable, str(EXAMPLE), "--model", model, "--steps", str(steps)]
        proc = subprocess.run(
            [*argv, "--out", str(out)],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        result = json.loads(out.read_text(encoding="utf-8"))
        rewards = [h["reward"] for h in result["history"]]
        assert len(rewards) == steps
        first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
        assert last >= 1.5 * first and last - first > 0.15, f"reward {first:.3f} -> {last:.3f}"
        # save_state made a training checkpoint the API knows
        ckpt = models.post_training.checkpoints.retrieve(result["checkpoint"].rsplit("/", 1)[-1])
        assert str(ckpt.type).endswith("TRAINING")
        assert st.api_key.get() not in proc.stdout + proc.stderr
        assert "Retrying" not in proc.stderr and "huggingface.co" not in proc.stderr
    finally:
        daemon.stop(home)
