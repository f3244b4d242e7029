"""``%tg launch`` and ``%%tg launch``: the line's options and the cell's YAML as one run config,
launched with `Session.launch` (``--dry-run``: checked and printed, nothing launched).

The config is what `Session.launch` takes: a config mapping (``algorithm``, ``model``, ``trl``, ...)
and the keyword options (``name``, ``preemptible``). A YAML body that does not parse is a
`UsageError` naming its line and column; unknown config keys and wrong types are the training
config's own `TrainConfigError`, raised by `Session.launch`'s checks before anything is sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from tgnb.notebook.commands.grammar import Parser, number, out_name, whole
from tgnb.tasks.config import ALGORITHMS

if TYPE_CHECKING:
    from tgnb.notebook.magics import Tg

USAGE = "%(prog)s grpo|dpo|sft|SCRIPT.py [options] [-o NAME] [-- SCRIPT ARGS]"
CELL = True  # a %%tg launch cell body (the YAML), and a script's own arguments after --
STORES = True


def arguments(p: Parser) -> None:
    p.add_argument(
        "algorithm", nargs="?", help="grpo, dpo, sft, or a script of the workdir (train.py)"
    )
    p.add_argument("--workdir", help="the folder shipped with the run (default: the notebook's)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and print the config as the node will run it; launch nothing",
    )
    p.add_argument("--name", help="the run's name (default: generated)")
    p.add_argument("--model", help="model name or path")
    p.add_argument("--dataset", help="dataset name")
    p.add_argument("--reward", dest="rewards", action="append", help="reward (repeat for several)")
    p.add_argument("--steps", dest="max_steps", type=whole, help="max_steps")
    p.add_argument("--lr", type=number, help="learning rate (trl.learning_rate)")
    p.add_argument("--seed", type=whole, help="random seed")
    p.add_argument("--nodes", type=whole, help="nodes (default 1)")
    p.add_argument("--gpus-per-node", type=whole, help="GPUs per node (default 8)")
    p.add_argument("--min-nodes", type=whole, help="fewest nodes a restart may use (shrink)")
    p.add_argument(
        "--recovery",
        choices=("wait", "shrink", "standard"),
        help="when preemptible capacity is short at a restart: wait (default), shrink, standard",
    )
    p.add_argument(
        "--fault-tolerance",
        choices=("torchft",),
        help="run the nodes as TorchFT replica groups: survivors go on through a preemption",
    )
    p.add_argument(
        "--budget-usd",
        type=number,
        help="stop the run (it checkpoints) once it has cost this many dollars; notice at 80 %%",
    )
    kind = p.add_mutually_exclusive_group()
    kind.add_argument(
        "--preemptible",
        dest="preemptible",
        action="store_true",
        default=None,
        help="run on preemptible nodes (the default)",
    )
    kind.add_argument(
        "--standard", dest="preemptible", action="store_false", help="run on standard nodes"
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other config key, dotted (e.g. trl.num_generations=4); value read as YAML",
    )
    p.add_argument(
        "-o",
        "--out",
        type=out_name,
        metavar="NAME",
        help="store the Run under NAME in the namespace",
    )


def run(tg: Tg, args: Any, cell: str | None) -> Any:
    algorithm, options = launch_request(args, cell)
    if options.get("budget_usd") is not None:
        options["prices"] = tg.prices()  # the dollars per GPU-hour %tg cost shows
    if args.dry_run:
        print(tg.attached().launch(algorithm, dry_run=True, **options), end="")
        return None
    launched = tg.attached().launch(algorithm, **options)
    tg.remember(launched)
    tg.store(args.out, launched)
    return launched


#: Line options and the config key each one sets (dotted keys are nested).
_OPTION_KEYS = {
    "model": "model",
    "dataset": "dataset",
    "rewards": "rewards",
    "max_steps": "max_steps",
    "lr": "trl.learning_rate",
    "seed": "seed",
    "fault_tolerance": "fault_tolerance",
}


def parse_body(cell: str) -> dict[str, Any]:
    """The cell's YAML as a mapping; a parse error names the line and column."""
    import yaml

    from tgnb.tasks.config import load_yaml

    try:
        body = load_yaml(cell)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"%%tg launch: the YAML body does not parse{where}: {problem}") from None
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise UsageError(
            "%%tg launch: the YAML body must be a mapping such as 'algorithm: grpo', "
            f"not a {type(body).__name__}"
        )
    return body


#: Body keys that are launch options, not config keys.
_BODY_OPTIONS = (
    "workdir",
    "recovery",
    "min_nodes",
    "budget_usd",
)  # Session.launch options, not config


def launch_request(args: Any, cell: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config mapping, keyword options) for `Session.launch` from parsed options and a body;
    ``args.script_args`` holds what followed ``--`` on the line (a script's arguments)."""
    from tgnb.tasks.config import apply_overrides

    raw = parse_body(cell) if cell is not None else {}
    options: dict[str, Any] = {k: raw.pop(k) for k in _BODY_OPTIONS if k in raw}
    what = args.algorithm
    script_args = list(getattr(args, "script_args", None) or [])
    if what and what.endswith(".py"):
        raw.update(algorithm="script", script=what)
    elif what and what.lower() in ALGORITHMS:
        raw["algorithm"] = what.lower()
    elif what:
        raise UsageError(
            f"%tg launch: {what!r} is neither an algorithm ({', '.join(ALGORITHMS)}) nor a script "
            "(a .py file): e.g. %tg launch grpo, or %tg launch train.py -- --lr 1e-4"
        )
    if "script" in raw or "command" in raw:
        raw.setdefault("algorithm", "script")
    if script_args:
        if raw.get("algorithm") != "script" or "script" not in raw:
            raise UsageError(
                "%tg launch: arguments after -- go to a script: %tg launch x.py -- ..."
            )
        raw["args"] = [*(raw.get("args") or []), *script_args]
    if not raw.get("algorithm"):
        raise UsageError(
            "%tg launch: say what to run: %tg launch grpo (or dpo, sft), %tg launch train.py, "
            "or 'algorithm: grpo' / 'script: train.py' in the %%tg launch body"
        )
    sets = [
        f"{key}={_yaml_value(getattr(args, attr))}"
        for attr, key in _OPTION_KEYS.items()
        if getattr(args, attr) is not None
    ]
    raw = apply_overrides(raw, [*sets, *args.sets])
    if getattr(args, "workdir", None):
        options["workdir"] = args.workdir
    if args.name:
        options["name"] = args.name
    if args.preemptible is not None:
        options["preemptible"] = args.preemptible
    if args.nodes is not None:
        options["nodes"] = args.nodes
    if args.gpus_per_node is not None:
        options["gpus_per_node"] = args.gpus_per_node
    if getattr(args, "min_nodes", None) is not None:
        options["min_nodes"] = args.min_nodes
    if getattr(args, "budget_usd", None) is not None:
        options["budget_usd"] = args.budget_usd
    if getattr(args, "recovery", None) is not None:
        options["recovery"] = args.recovery  # a when_short name (tgnb.runs.recovery)
    return raw, options


def _yaml_value(value: Any) -> str:
    import json

    return json.dumps(value)  # JSON is YAML: lists, numbers and strings read back as they were
