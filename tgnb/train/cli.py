"""``python -m tgnb.train CONFIG.yaml [--set key=value ...] [--run-dir DIR]`` (also ``tgnb train``).

Exit codes: 0 the run finished; `EXIT_PREEMPTED` (75) it was preempted and checkpointed and wants to
be restarted; 2 the config is bad (one line on stderr, no traceback); 78 (`Exit.REPEATS`) a failure
every start would repeat (a module not installed, CUDA absent: `tgnb.runs.outcome.repeats`), final;
1 any other failure.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from tgnb.errors import TgnbError, TrainConfigError
from tgnb.runs.node import Exit
from tgnb.runs.runfile import RunFile
from tgnb.tasks.config import SCRIPT, TrainConfig


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb train",
        description="Run a TRL GRPO, DPO or SFT job, or your own script, that checkpoints on "
        "preemption and resumes.",
        epilog="Exit codes: 0 finished, 75 preempted and checkpointed (restart me), "
        "2 bad config, 78 a failure every start would repeat, 1 other failure.",
    )
    p.add_argument("config", nargs="?", help="YAML config file (omit to use only --set values)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a dotted key, value read as YAML (e.g. --set trl.learning_rate=1e-3)",
    )
    p.add_argument("--run-dir", help="run directory (default: $TGNB_HOME/runs/NAME)")
    p.add_argument("--check", action="store_true", help="validate the config, print it, and exit")
    return p


def node_config(
    path: str | None, overrides: Sequence[str], run_dir: str | None
) -> tuple[TrainConfig, RunFile | None]:
    """The config this process runs, and the run file a launch validated it in (None: check it in
    full): the engine's run file (`tgnb.runs.node.RUN_FILE`, read once and typed:
    `tgnb.runs.runfile.RunFile.load`), or a person's YAML (``tgnb train config.yaml``,
    `tgnb.tasks.config.load`). A ``--set`` on a run file makes it a new config, checked in full."""
    import dataclasses
    from pathlib import Path

    from tgnb.runs.node import RUN_FILE
    from tgnb.tasks import config

    if path is None or Path(path).name != RUN_FILE:
        return config.load(path, overrides, run_dir), None
    run = RunFile.load(path)
    cfg = run.train
    if run_dir is not None:
        cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    if overrides:
        raw = config.apply_overrides(cfg.compact(), overrides)
        return config.from_dict({**raw, "run_dir": cfg.run_dir}), None
    return cfg, run


def enter_workdir(cfg: TrainConfig) -> TrainConfig:
    """The run's workdir snapshot, when it has one, becomes the working directory and the first
    entry of ``sys.path`` (relative dataset paths, reward modules, the script's own imports);
    returns `cfg` with its run directory made absolute first."""
    import dataclasses
    from pathlib import Path

    from tgnb.train.program import workdir_of

    run_dir = Path(cfg.run_dir or ".").resolve()
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    snap = workdir_of(run_dir)
    if snap != Path.cwd():
        import os

        os.chdir(snap)
        sys.path.insert(0, str(snap))
    return cfg


def resolved(cfg: TrainConfig) -> dict[str, Any]:
    """The config as the node runs it: under ``trl``, tgnb's own defaults (the CPU settings, the
    tuned ones for ``tiny``) merged with the config's, so nothing is hidden."""
    out = cfg.to_dict()
    if cfg.algorithm != SCRIPT:
        import torch

        from tgnb.train.runner import training_kwargs

        out["trl"] = training_kwargs(cfg, torch.cuda.is_available())
    else:
        for key in ("dataset", "rewards", "trl", "lora", "dataset_config", "dataset_size"):
            out.pop(key, None)
    return out


def train(cfg: TrainConfig, run_file: str | None = None) -> int:
    """Run `cfg`: the user's script or command, or a built-in task; its exit code. `run_file`:
    the run file a launch validated `cfg` in (`node_config`; an absolute path), so only what
    needs this node is checked here, and the user's program reads its checkpoint policy there
    (`tgnb.runs.node.RUN_FILE_ENV`); None: `cfg` is checked in full."""
    if cfg.algorithm == SCRIPT:
        from tgnb.runs.outcome import events_size, node_exit
        from tgnb.train.program import run_program

        since = events_size(cfg.run_dir or ".")
        return node_exit(cfg.run_dir, run_program(cfg, run_file), since)  # a launcher's 1 or 143
    from tgnb.train.runner import run

    return run(cfg, run_file is not None)


def _train_or_done(cfg: TrainConfig, run_file: str | None) -> int:
    """`train`, where a restart after the last step is done (exit 0), as the node's meter says."""
    from tgnb.train.validate import RunFinished

    try:
        return train(cfg, run_file)
    except RunFinished as exc:
        print(f"tgnb train: {exc}", flush=True)
        return 0


def _line(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"[:400]


def _say(text: str) -> None:
    """`text` on stderr (the node's log) with the node's secrets masked (`tgnb.config.scrub`)."""
    from tgnb.config import register_node_secrets, scrub

    register_node_secrets()
    print(scrub(text), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from tgnb.train.validate import RunFinished, validate

    try:
        cfg, run = node_config(args.config, args.overrides, args.run_dir)
        run_file = None if run is None or args.config is None else os.path.abspath(args.config)
        cfg, launched = enter_workdir(cfg), run is not None
        if args.check:
            validate(cfg, launched=launched)
            import yaml

            print(yaml.safe_dump(resolved(cfg), sort_keys=False), end="")
            return 0
        from tgnb.train.budget import held

        budget = None if run is None else run.budget()  # metered, the run file's budget held
        return held(cfg.run_dir, lambda: _train_or_done(cfg, run_file), budget)
    except RunFinished as exc:  # a restart after the last step: done, not a bad config
        print(f"tgnb train: {exc}", flush=True)
        return 0
    except TrainConfigError as exc:
        _say(f"tgnb train: {exc}")
        return int(Exit.BAD_CONFIG)
    except TgnbError as exc:
        _say(f"tgnb train: {exc}")
        return int(Exit.FAILED)
    except Exception as exc:  # a real failure: keep the traceback for the log
        import traceback

        from tgnb.runs.outcome import repeat_fix, repeats

        _say(traceback.format_exc().rstrip("\n"))
        if repeats(exc):  # a module not installed, CUDA absent: final on every engine
            line = _line(exc)
            _say(f"tgnb train: {line}: it fails the same way at every start: {repeat_fix(line)}")
            return int(Exit.REPEATS)
        return int(Exit.FAILED)
    except KeyboardInterrupt:
        print("tgnb train: interrupted", file=sys.stderr)
        return int(Exit.FAILED)
