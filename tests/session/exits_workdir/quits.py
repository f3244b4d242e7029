"""A script with no hook (neither protect nor the Checkpointer) that exits 0 on SIGTERM without
saving anything, as a script written from a tutorial's "graceful shutdown" does. It logs its steps
as rows of the run directory's metrics.jsonl (the run directory's documented layout)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
steps = int(sys.argv[1])
metrics = os.path.join(os.environ["TGNB_RUN_DIR"], "metrics.jsonl")
for step in range(1, steps + 1):
    time.sleep(0.05)
    with open(metrics, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"step": step, "time": time.time()}) + "\n")
print("quits: done", flush=True)
