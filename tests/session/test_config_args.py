"""A config's ``args`` reach the program as the text written, on the local engine (real emulator,
the real supervisor, the script in its own process): YAML 1.1 read ``007`` as 7, ``3.0e-4`` as
0.0003 and a version ``1.10`` as 1.1, and they were printed back that way. And a config with
``script:`` alone (no ``algorithm: script``), as docs/own-code.md shows it, is a script run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tgnb.runs.spec import JobState
from tgnb.session import Session

WRITTEN = ["--tag", "007", "--lr", "3.0e-4", "--version", "1.10", "--flag", "yes", "--n", "0x1F"]
SHOW = "import json, sys\nprint('argv:', json.dumps(sys.argv[1:]), flush=True)\n"


def _argv(lines: list[str]) -> Any:
    (line,) = [ln for ln in lines if ln.startswith("argv: ")]
    return json.loads(line.removeprefix("argv: "))


@pytest.mark.slow
def test_a_yaml_configs_args_reach_the_script_as_written(session: Session, tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "show.py").write_text(SHOW)
    config = wd / "run.yaml"  # script: alone, no algorithm: script
    config.write_text(f"script: show.py\nargs: [{', '.join(WRITTEN)}]\n")
    run = session.launch(str(config), workdir=wd, name="args-as-written")
    status = run.wait(timeout=180, progress=False)
    assert status.state is JobState.SUCCEEDED, run.logs()[-20:]
    assert _argv(run.logs()) == WRITTEN


def test_a_launch_bodys_args_and_a_set_are_read_as_written() -> None:
    from tgnb.tasks.config import apply_overrides, load_yaml

    body = load_yaml(f"script: show.py\nargs: [{', '.join(WRITTEN)}]\ntrl: {{lr: 3.0e-4}}\n")
    assert body["args"] == WRITTEN and body["trl"] == {"lr": 3.0e-4}  # only argv is text
    assert apply_overrides({}, ["args=[--tag, 007, --v, 1.10]"]) == {
        "args": ["--tag", "007", "--v", "1.10"]
    }
    assert load_yaml("command: [python, t.py, --lr, 1e-4, '2']")["command"][3:] == ["1e-4", "2"]
