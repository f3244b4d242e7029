"""A Tinker script run with no key, as a new user first runs one: it is told in one line what to
do, and doing it works. The script runs from a folder of its own against the real emulator daemon
that ``tgnb emulator start`` starts (loopback HTTP, nothing faked); the two export lines are the
ones the command printed, run by bash as a user pastes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")

SCRIPT = """\
import tgnb.tinker as tinker

service_client = tinker.ServiceClient()
training_client = service_client.create_lora_training_client(base_model="tgnb/tiny-llama", rank=8)
print("model:", training_client.get_info().model_data.model_name)
service_client.close()
"""


def test_no_key_says_how_to_get_one_and_the_way_it_names_works(tmp_path: Path) -> None:
    folder = tmp_path / "my-tinker-project"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT, encoding="utf-8")
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOGETHER_")}
    env.update(TGNB_HOME=str(home), TOGETHER_DISABLE_VERSION_CHECK="1")

    bare = subprocess.run(
        [sys.executable, "train.py"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = bare.stderr.strip().splitlines()[-1]
    assert bare.returncode == 1
    assert last.startswith("tgnb.errors.ConfigError: no TOGETHER_API_KEY is set"), bare.stderr
    assert "`tgnb emulator start`" in last
    assert "api_key client option" not in bare.stderr  # not the SDK's own, at a later call
    assert not home.exists()  # nothing started behind the script's back

    tgnb = [sys.executable, "-m", "tgnb.cli", "emulator"]
    try:
        started = subprocess.run(
            [*tgnb, "start"], env=env, capture_output=True, text=True, timeout=300
        )
        assert started.returncode == 0, started.stderr
        exports = [ln.strip() for ln in started.stdout.splitlines() if "export " in ln]
        assert [e.split("=")[0] for e in exports] == [
            "export TOGETHER_BASE_URL",
            "export TOGETHER_API_KEY",
        ]
        key = (home / "emulator" / "api_key").read_text(encoding="utf-8").strip()
        assert key not in started.stdout  # the line reads the key file; it does not print it
        ran = subprocess.run(
            ["bash", "-c", "\n".join([*exports, f"exec {sys.executable} train.py"])],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode == 0, ran.stderr
        assert "model: tgnb/tiny-llama" in ran.stdout
        assert key not in ran.stdout + ran.stderr
    finally:
        subprocess.run([*tgnb, "stop"], env=env, capture_output=True, timeout=120)
