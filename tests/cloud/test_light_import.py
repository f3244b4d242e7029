"""``import tgnb.cloud`` stays light: the SDK is imported on first use, heavy libraries never."""

from __future__ import annotations

import json
import subprocess
import sys


def test_import_tgnb_cloud_is_light() -> None:
    probe = "import tgnb.cloud, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = {m.split(".")[0] for m in json.loads(out.stdout.strip().splitlines()[-1])}
    assert not loaded & {"torch", "trl", "transformers", "kubernetes", "together", "pandas"}
