"""The first line of each attempt's output: an ``@tgnb`` record of kind `tgnb.runs.livelog.ATTEMPT`
(this start's restart count, the node, the time), printed once per node and attempt by the node's
top tgnb process (``python -m tgnb.train``, or ``python -m tgnb.train.launch`` around torchrun),
before the program prints anything. `tgnb.runs.livelog` reads it where one attempt's output ends
and the next one's begins: the engines append every attempt to one log (the local ``train.log``, a
Slurm job's output file) or stream one pod after another (Kubernetes).

The processes the top one starts (torchrun's workers) inherit `tgnb.runs.livelog.MARKED_ENV` and
print none.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from tgnb.events import STDOUT_PREFIX, utcnow
from tgnb.runs import livelog, node


def mark() -> None:
    """Print this attempt's marker on stdout, unless an outer tgnb process of the node did."""
    if os.environ.get(livelog.MARKED_ENV):
        return
    os.environ[livelog.MARKED_ENV] = "1"
    where = os.environ.get(node.NODE_ENV) or os.environ.get("SLURMD_NODENAME")
    record = {
        "kind": livelog.ATTEMPT,
        "restart_count": node.restart_count(),
        "node": where or socket.gethostname(),
        "time": utcnow().isoformat(),
    }
    sys.stdout.write(f"{STDOUT_PREFIX}{json.dumps(record)}\n")
    sys.stdout.flush()
