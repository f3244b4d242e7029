"""The environment the tests run in has the JupyterLab extension the README promises: after
``pip install -e '.[all]'``, ``jupyter labextension list`` shows tgnb enabled and OK, and the
server extension is enabled. No browser; a missing or broken extension fails (never skips)."""

from __future__ import annotations

import re
import subprocess
import sys


def jupyter(module: str, *args: str) -> str:
    """A Jupyter command of this Python's environment (``python -m jupyter`` would run the
    ``jupyter-*`` script found first on the PATH, maybe another environment's)."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # no colour codes
    assert proc.returncode == 0, out
    return out


def test_jupyter_lists_the_tgnb_labextension_enabled_and_ok() -> None:
    listing = jupyter("jupyterlab.labextensions", "list")
    assert re.search(r"^\s+tgnb v\S+ enabled OK", listing, re.M), (
        "JupyterLab has no working tgnb sidebar: reinstall with `pip install -e '.[all]'` "
        f"(Node.js >= 18 and npm on the PATH).\n{listing}"
    )


def test_the_tgnb_server_extension_is_enabled() -> None:
    servers = jupyter("jupyter_server.extension.serverextension", "list")
    assert re.search(r"tgnb\.server\s+enabled", servers), servers
    assert re.search(r"tgnb\.server\s+OK", servers), servers
