"""``python -m tgnb.train CONFIG.yaml [--set key=value ...] [--run-dir DIR]``."""

import sys

from tgnb.train.cli import main

if __name__ == "__main__":
    sys.exit(main())
