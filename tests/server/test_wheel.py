"""The wheel ships the prebuilt extension: built from this checkout (with the labextension built by
``.ci/extension-build``), installed in a fresh virtual environment whose PATH has no Node.js,
``jupyter labextension list`` reports tgnb enabled and OK from that environment, and the server
extension is enabled by the shipped ``jupyter_server_config.d/tgnb.json``.

Slow (a venv install of jupyterlab and the build backend from the package index or pip's cache,
a wheel build in it, and the install of that wheel). A missing labextension build fails the test
(the README's install builds it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LABEXTENSION = REPO / "tgnb" / "labextension"

pytestmark = pytest.mark.slow


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> str:
    proc = subprocess.run(
        cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}"
    return re.sub(r"\x1b\[[0-9;]*m", "", out)  # no colour codes


def test_wheel_installs_the_prebuilt_extension_without_nodejs(tmp_path: Path) -> None:
    if not (LABEXTENSION / "static" / "style.js").exists():
        pytest.fail(
            "tgnb/labextension is not built: `pip install -e '.[all]'` builds it (Node.js >= 18 "
            "and npm on the PATH), or run .ci/extension-build"
        )
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel_target = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    shared = wheel_target.get("shared-data", {})
    assert shared.get("tgnb/labextension") == "share/jupyter/labextensions/tgnb", (
        "pyproject.toml must ship the prebuilt extension: [tool.hatch.build.targets.wheel."
        'shared-data] "tgnb/labextension" = "share/jupyter/labextensions/tgnb"'
    )
    no_node = tmp_path / "bin-without-node"
    no_node.mkdir()
    venv = tmp_path / "venv"
    path = f"{venv / 'bin'}{os.pathsep}{no_node}"
    env = {
        "HOME": str(tmp_path / "home"),
        "PATH": path,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        if name in os.environ:
            env[name] = os.environ[name]
    # the user's pip cache (not the temporary HOME's): packages come from the index at most once
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    assert shutil.which("node", path=path) is None and shutil.which("npm", path=path) is None

    # one install of JupyterLab, not two: the venv gets it together with what the build needs
    # (pyproject's build-system requires and the jupyter-builder hook's dependencies, the same
    # that pip's isolated build environment would install) and builds the wheel without isolation
    hook = project["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
    build_deps = [*project["build-system"]["requires"], *hook["dependencies"]]
    assert any(d.startswith("jupyterlab") for d in build_deps), build_deps
    # a venv without a pip of its own (ensurepip's install of pip is most of a venv's creation):
    # this interpreter's pip installs into it and builds with it (``pip --python``)
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env, tmp_path)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    # no byte-compiling of every module installed: what the jupyter commands below import is
    # compiled when they import it
    run([*pip, "install", "-q", "--no-compile", "jupyterlab>=4.6,<5", *build_deps], env, tmp_path)

    dist = tmp_path / "dist"
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w"]
    run([*build, str(dist), str(REPO)], env, tmp_path)
    (wheel,) = dist.glob("tgnb-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = "tgnb-0.1.0.data/data/"
    assert f"{data}share/jupyter/labextensions/tgnb/package.json" in names
    assert f"{data}share/jupyter/labextensions/tgnb/static/style.js" in names
    assert f"{data}etc/jupyter/jupyter_server_config.d/tgnb.json" in names

    # the wheel itself; its runtime dependencies (the together SDK, ...) play no part in what
    # JupyterLab finds, and tgnb.server imports none of them
    run([*pip, "install", "-q", "--no-compile", "--no-deps", str(wheel)], env, tmp_path)

    listing = run([python, "-m", "jupyter", "labextension", "list"], env, tmp_path)
    sections = re.split(r"\n(?=\S)", listing)
    ours = [s for s in sections if s.startswith(str(venv / "share" / "jupyter" / "labextensions"))]
    assert ours, listing
    assert re.search(r"^\s+tgnb v0\.1\.0 enabled OK \(python, tgnb\)", ours[0], re.M), listing

    servers = run([python, "-m", "jupyter", "server", "extension", "list"], env, tmp_path)
    assert re.search(r"tgnb\.server\s+enabled", servers), servers
    assert re.search(r"tgnb\.server\s+OK", servers), servers
