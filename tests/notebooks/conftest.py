"""Fixtures for the example notebooks: each executed once with papermill, in a temporary tgnb home,
with a recognizable fake Together API key in the kernel's environment.

Nothing is faked: the notebooks start the real emulator daemon (loopback HTTP) under the temporary
home and train the built-in tiny task with TRL on the CPU. The key is never used (the notebooks
attach with ``--local``); it is there so that the tests can prove it leaks nowhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tgnb.session import shutdown_local

#: A key no real account has, easy to grep for.
FAKE_KEY = "tgnb-fake-key-DO-NOT-LEAK-1234"

#: Small parameters so that each notebook runs in a minute or two on a 2-core CPU. The quickstart's
#: run must still be going when its node is preempted: a tiny GRPO step takes about 50-70 ms here,
#: and between the launch and the preemption's SIGTERM about 2 s pass (the cells in between, the
#: preempt cell's 0.5 s polls, the supervisor's), so 16 steps could be over first.
PARAMETERS: dict[str, dict[str, Any]] = {
    "quickstart": {"max_steps": 60, "preempt_at": 4},
    "grpo-sweep": {"learning_rates": [5e-3, 2e-2], "max_steps": 6},
    "dpo": {"max_steps": 8},
}


@dataclass
class Executed:
    """The executed notebooks (by short name), their tgnb home and how long each ran."""

    home: Path
    out: Path
    notebooks: dict[str, Path] = field(default_factory=dict)
    html: dict[str, Path] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    fake_key: str = FAKE_KEY
    parameters: dict[str, dict[str, Any]] = field(default_factory=lambda: PARAMETERS)

    def nb(self, name: str) -> Any:
        import nbformat

        if name in self.errors:
            pytest.fail(f"notebook {name} failed: {self.errors[name]}")
        return nbformat.read(self.notebooks[name], as_version=4)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Executed]:
    """All three notebooks run in order (quickstart, sweep, DPO) against one emulator."""
    from tgnb import batch

    root = tmp_path_factory.mktemp("notebooks")
    result = Executed(home=root / "tgnb-home", out=root / "out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TGNB_HOME", str(result.home))
        mp.setenv("TOGETHER_API_KEY", FAKE_KEY)
        for var in ("TOGETHER_BASE_URL", "TOGETHER_PROJECT_ID"):
            mp.delenv(var, raising=False)
        mp.setenv("HF_HUB_OFFLINE", "1")
        try:
            # the quickstart through the command line (the README's main job), the others through
            # the Python API
            t0 = time.monotonic()
            argv = ["run", "quickstart", "--out", str(result.out), "--home", str(result.home)]
            for key, value in PARAMETERS["quickstart"].items():
                argv += ["-p", key, json.dumps(value)]
            rc = batch.main(argv)
            result.seconds["quickstart"] = time.monotonic() - t0
            result.notebooks["quickstart"] = result.out / batch.NOTEBOOKS["quickstart"]
            result.html["quickstart"] = result.notebooks["quickstart"].with_suffix(".html")
            if rc != 0:
                result.errors["quickstart"] = f"tgnb notebooks run quickstart exited {rc}"
            for name, params in PARAMETERS.items():
                if name == "quickstart":
                    continue
                t0 = time.monotonic()
                try:
                    done = batch.run_notebook(name, result.out, params, home=result.home)
                except batch.NotebookError as exc:
                    result.errors[name] = str(exc)
                    result.notebooks[name] = exc.output
                    continue
                finally:
                    result.seconds[name] = time.monotonic() - t0
                result.notebooks[name] = done.output
                assert done.html is not None
                result.html[name] = done.html
            (result.out / "timings.json").write_text(json.dumps(result.seconds, indent=1))
            print("notebook run times (s):", {k: round(v) for k, v in result.seconds.items()})
            yield result
        finally:
            shutdown_local(result.home)
