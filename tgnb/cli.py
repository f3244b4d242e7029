"""The ``tgnb`` console script: a router onto each part's own command line.

Each subcommand lives beside the code it drives and is imported only when used, so
``tgnb emulator status`` never imports torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module with ``main(argv) -> int``, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "emulator": ("tgnb.emulator.cli", "start, stop, inspect or serve the local emulated cluster"),
    "train": ("tgnb.train.cli", "run a GRPO or DPO training job from a YAML config"),
    "demo": ("tgnb.demo", "the main job on the local emulator: preempt a run, watch it resume"),
    "certify": (
        "tgnb.certify_cli",
        "run a training script under preemptions beside an uninterrupted run; exit 1 if unsafe",
    ),
    "pt": (
        "tgnb.posttraining.cli",
        "Post-Training resources left running by processes that are gone: list, stop",
    ),
    "notebooks": (
        "tgnb.batch",
        "run the example notebooks with papermill; keep executed copies and HTML",
    ),
}


def _usage() -> str:
    lines = ["usage: tgnb COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines.append("\nRun 'tgnb COMMAND --help' for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from tgnb import __version__

        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"tgnb: unknown command '{name}'.{hint} Run 'tgnb --help'.", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
