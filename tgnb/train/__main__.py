"""``python -m tgnb.train CONFIG.yaml [--set key=value ...] [--run-dir DIR]``."""

import sys

from tgnb.train.cli import main

if __name__ == "__main__":
    if "--check" not in sys.argv[1:]:  # a node's start, not a launch's check: mark the attempt
        from tgnb.train.attempt import mark

        mark()
    sys.exit(main())
