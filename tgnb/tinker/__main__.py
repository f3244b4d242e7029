"""``python -m tgnb.tinker script.py args...`` (or ``-m package.module args...``): run a Tinker
program unchanged on Post-Training, every ``import tinker`` in it answering `tgnb.tinker`
(see `tgnb.tinker._install`)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

USAGE = "usage: python -m tgnb.tinker SCRIPT.py [ARGS...]  or  python -m tgnb.tinker -m MODULE [ARGS...]"


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit(USAGE)
    from tgnb.tinker import install

    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, str(Path.cwd()))  # as ``python -m`` does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = Path(argv[0])
    if not script.is_file():
        raise SystemExit(f"{script}: no such script. {USAGE}")
    sys.argv = list(argv)
    sys.path.insert(0, str(script.resolve().parent))  # as ``python script.py`` does
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
