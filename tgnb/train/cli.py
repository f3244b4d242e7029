"""``python -m tgnb.train CONFIG.yaml [--set key=value ...] [--run-dir DIR]`` (also ``tgnb train``).

Exit codes: 0 the run finished; `EXIT_PREEMPTED` (75) it was preempted and checkpointed and wants to
be restarted; 2 the config is bad (one line on stderr, no traceback); 1 any other failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tgnb.errors import TgnbError, TrainConfigError

EXIT_BAD_CONFIG = 2
EXIT_FAILED = 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb train",
        description="Run a TRL GRPO or DPO training job that checkpoints on preemption and resumes.",
        epilog="Exit codes: 0 finished, 75 preempted and checkpointed (restart me), "
        "2 bad config, 1 other failure.",
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from tgnb.tasks import config
    from tgnb.train.validate import validate

    try:
        cfg = config.load(args.config, args.overrides, args.run_dir)
        if args.check:
            validate(cfg)
            import yaml

            print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
            return 0
        from tgnb.train.runner import run

        return run(cfg)
    except TrainConfigError as exc:
        print(f"tgnb train: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except TgnbError as exc:
        print(f"tgnb train: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception:  # a real failure: keep the traceback for the log
        import traceback

        traceback.print_exc()
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("tgnb train: interrupted", file=sys.stderr)
        return EXIT_FAILED
