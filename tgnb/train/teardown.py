"""A node process's exit without the interpreter's slowest part: after ``sys.exit`` Python runs
full garbage collections over every object torch, transformers and TRL created (half a million for
a tiny run) while it tears the modules down, seconds of CPU before the process ends (0.4-3 s on an
idle 2-core machine, over 10 s under load), and every restart of a preempted run waits for them.

`light_exit` registers an ``atexit`` hook that collects the garbage there is at that point (its
finalizers run as they would have) and then moves every live object to the collector's permanent
generation (``gc.freeze``), so the collections of the teardown only look at what the teardown itself
frees. Objects freed by reference count are finalized as before; only cycles that the teardown
would have found among the modules' own objects are left to the OS, which Python never promised to
finalize at exit anyway. Registered at the start of the process, the hook runs after the ``atexit``
hooks registered later (torch's, the DCP writer's, a user's script's).
"""

from __future__ import annotations

import atexit
import gc


def light_exit() -> None:
    """Make this process's exit skip the collector's passes over objects still alive at exit."""
    atexit.register(_freeze)


def _freeze() -> None:
    gc.collect()
    gc.freeze()
