"""The workload plane's notebook-facing modules stay light: no torch, TRL, transformers or
kubernetes at import time (the training stack is imported by the processes that train)."""

import json
import subprocess
import sys

HEAVY = ("torch", "trl", "transformers", "kubernetes", "datasets", "accelerate", "peft", "pandas")


def test_session_and_local_backend_import_light() -> None:
    code = (
        "import sys, json, tgnb, tgnb.session, tgnb.runs, tgnb.demo, tgnb.backends.local,"
        " tgnb.backends.registry, tgnb.backends.local.supervisor, tgnb.backends.local.warm\n"
        "assert tgnb.attach is tgnb.session.attach and tgnb.Session is tgnb.session.Session\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(m for m in loaded if m.split(".")[0] in HEAVY) == []
