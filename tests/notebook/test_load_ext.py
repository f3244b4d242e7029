"""``%load_ext tgnb`` in a fresh process with a real `InteractiveShell`: it registers ``%tg`` and
imports none of torch, TRL, transformers, kubernetes (nor pandas, the SDK or ipywidgets)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import heavy_in

PROBE = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "tgnb")
shell.run_line_magic("tg", "--help")
shell.run_line_magic("tg", "launch --help")
shell.run_line_magic("config", "Tg.poll_interval = 1.5")
print(json.dumps({"modules": sorted(sys.modules), "line": sorted(shell.magics_manager.magics["line"]),
                  "cell": sorted(shell.magics_manager.magics["cell"]),
                  "poll": shell.magics_manager.registry["Tg"].poll_interval}))
"""


def test_load_ext_is_light_and_registers_tg() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = heavy_in(report["modules"])
    assert heavy == [], f"%load_ext tgnb imported heavy modules: {heavy[:10]}"
    for lazy in ("pandas", "together", "ipywidgets"):
        assert lazy not in report["modules"], f"{lazy} is imported by %load_ext tgnb"
    assert "tg" in report["line"] and "tg" in report["cell"]
    assert report["poll"] == 1.5
