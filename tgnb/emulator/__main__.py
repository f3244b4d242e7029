"""``python -m tgnb.emulator start|stop|status|serve`` (same as ``tgnb emulator ...``)."""

import sys

from tgnb.emulator.cli import main

sys.exit(main())
