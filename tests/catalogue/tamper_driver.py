"""Restart real runs, one after another, as the local backend's warm starts do: import the training
stack once (`tgnb.backends.local.warm.preload`), then fork ``python -m tgnb.train`` per run directory.

``python tamper_driver.py TIMEOUT DIR [DIR...] -- --set k=v ...`` prints one JSON line per
directory: ``{"dir": ..., "code": exit code, or null when it was still running after TIMEOUT s
(then killed)}``. Each child's output goes to ``DIR.log``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from tgnb.backends.local.warm import fork_module, preload


def main(argv: list[str]) -> int:
    timeout = float(argv[0])
    split = argv.index("--")
    dirs, overrides = argv[1:split], argv[split + 1 :]
    if not preload("tgnb.train"):
        print("warm start failed", file=sys.stderr)
        return 1
    for d in dirs:
        with open(f"{d}.log", "wb") as log:
            env = dict(os.environ)
            proc = fork_module("tgnb.train", ["--run-dir", d, *overrides], env, d, log.fileno())
        deadline = time.monotonic() + timeout
        code = None
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                break
            time.sleep(0.05)
        if code is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        print(json.dumps({"dir": d, "code": code}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
