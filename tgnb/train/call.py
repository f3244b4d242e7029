"""``python -m tgnb.train.call FILE``: the node's side of ``session.submit(fn, *args)``
(`tgnb.runs.call`).

Reads the call (the function and its arguments, pickled by cloudpickle) from `FILE` in the run's
workdir snapshot, calls it, and writes its outcome to the run directory's
`tgnb.runs.call.RESULT` in one rename (`tgnb.atomic.atomic_write`): the value, or the exception
with this node's traceback (printed on stderr too, so the run's error line is the exception's).
The outcome is also printed as an ``@tgnb`` record for the engines whose run directory is not on
the notebook's machine. Exit 0 with a value, 1 with an exception; an exit the function asks for
(``sys.exit``, the `tgnb.train.Checkpointer`'s 75 on a preemption) is left to end the process:
no outcome is written, the engine starts the call again and the function resumes from its
checkpoint.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tgnb.atomic import atomic_write
from tgnb.events import STDOUT_PREFIX
from tgnb.runs import call, node


def _pickled(obj: Any) -> bytes | None:
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return None


def write_outcome(run_dir: Path, kind: str, obj: Any, trace: str | None) -> None:
    """The call's outcome into `run_dir` (atomically) and as an ``@tgnb`` record on stdout."""
    data = _pickled(obj)
    if data is None and kind == "value":  # a value pickle refuses: an error of the call's own
        kind, trace = (
            "error",
            (
                f"the function returned a {type(obj).__name__}, which cannot be pickled: return "
                "plain data (numbers, strings, lists, dicts, arrays, tensors)"
            ),
        )
    where = os.environ.get(node.NODE_ENV) or os.environ.get("SLURMD_NODENAME") or None
    outcome = {"kind": kind, "pickle": data, "traceback": trace, "node": where}
    raw = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write(run_dir / call.RESULT, raw, fsync=True)
    if len(raw) <= call.RESULT_LOG_BYTES:
        text = base64.b64encode(raw).decode("ascii")
        record = json.dumps({"kind": call.RESULT_KIND, "outcome": text})
        sys.stdout.write(f"{STDOUT_PREFIX}{record}\n")
        sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if len(words) != 1:
        print("usage: python -m tgnb.train.call FILE (session.submit writes it)", file=sys.stderr)
        return int(node.Exit.BAD_CONFIG)
    run_dir = Path(os.environ.get(node.RUN_DIR_ENV) or ".")
    try:
        with open(words[0], "rb") as fh:
            fn, args, kwargs = pickle.load(fh)
        value = fn(*args, **kwargs)
    except Exception as exc:
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, end="", flush=True)
        write_outcome(run_dir, "error", exc, trace)
        return int(node.Exit.FAILED)
    write_outcome(run_dir, "value", value, None)
    return int(node.Exit.DONE)


if __name__ == "__main__":
    sys.exit(main())
