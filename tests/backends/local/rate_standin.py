"""The supervisor tests' stand-in training program (tests/backends/local/standin_train.py), which also
records the ``checkpoint:`` section of the run file (its training config) each start read, with its restart count:
what the runtime's ``checkpoint.auto`` would weigh at that start (the real runtime reports it as
``CheckpointIntervalChosen`` once a step is timed, which costs TRL; test_recovery_trl.py runs that)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import standin_train
import yaml

from tgnb.runs.runfile import RunFile


def main() -> int:
    config = yaml.safe_load(Path(sys.argv[1]).read_text())
    if "spec" in config:  # the run file (run.json), as the node is started now: its config
        config = RunFile.load(sys.argv[1]).train.compact()  # as its config.yaml view holds it
    run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
    seen = {"restart": os.environ.get("TGNB_RESTART_COUNT"), "checkpoint": config["checkpoint"]}
    with open(run_dir / "standin-checkpoint-config.jsonl", "a") as fh:
        fh.write(json.dumps(seen) + "\n")
    return standin_train.main()


if __name__ == "__main__":
    sys.exit(main())
