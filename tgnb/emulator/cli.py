"""``tgnb emulator start|stop|status|serve``: the local emulated cluster's command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tgnb.config import DEFAULT_TIME_SCALE
from tgnb.emulator import daemon
from tgnb.errors import TgnbError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb emulator",
        description="A local Together-compatible clusters API with an emulated preemptible fleet.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--home", type=Path, default=None, help="tgnb home (default $TGNB_HOME or ~/.tgnb)"
    )
    knobs = argparse.ArgumentParser(add_help=False)
    knobs.add_argument(
        "--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)"
    )
    knobs.add_argument(
        "--api-key",
        default=None,
        help="key clients must send (default $TGNB_EMULATOR_API_KEY or a saved one)",
    )
    knobs.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help="multiplies every platform duration (default %(default)g, as `%%tg attach --local`: "
        "a 300 s drain window lasts 6 s; 1: real time)",
    )
    knobs.add_argument(
        "--drain-window-s",
        type=float,
        default=300.0,
        help="platform seconds from preemption notice to removal",
    )
    knobs.add_argument(
        "--provision-delay-s",
        type=float,
        default=60.0,
        help="platform seconds to provision one preemptible node",
    )
    knobs.add_argument(
        "--preemption-rate",
        type=float,
        default=0.0,
        help="random preemptions per preemptible node-hour",
    )
    knobs.add_argument("--seed", type=int, default=0, help="seed of the random preemption schedule")
    knobs.add_argument(
        "--capacity",
        "--capacity-gpus",
        dest="capacity_gpus",
        type=int,
        default=None,
        help="cap on preemptible GPUs across all clusters",
    )
    knobs.add_argument(
        "--capacity-trace",
        default=None,
        metavar="FILE",
        help="preemptible capacity over platform time, JSON or YAML: "
        '{"segments": [{"at_s": 0, "gpus": 16}, {"at_s": 600, "gpus": 8}, ...]} '
        '(or {"generate": {"seed": 0, "capacity_gpus": 16, "withdrawn_gpus": 8, '
        '"mean_between_s": 3600, "mean_outage_s": 600}})',
    )
    knobs.add_argument(
        "--chaos",
        type=float,
        default=0.0,
        help="fraction of /v1 requests answered with 429, 503 or a long delay",
    )
    knobs.add_argument("--chaos-seed", type=int, default=0)
    knobs.add_argument(
        "--chaos-delay-s", type=float, default=65.0, help="how long a delayed request is held"
    )
    knobs.add_argument("--project-id", default=None, help="the project the key belongs to")
    knobs.add_argument(
        "--rl-price-per-gpu-hour",
        type=float,
        default=None,
        help="Post-Training price in $ per GPU-hour (default $TGNB_EMULATOR_RL_PRICE or 9)",
    )
    knobs.add_argument(
        "--rl-models",
        default=None,
        help="extra local Hugging Face model directories served by /v1/rl (':'-separated)",
    )
    knobs.add_argument(
        "--rl-idle-scale",
        type=float,
        default=1.0,
        help="real seconds per second of a resource's inactive_timeout (default 1; tests: less)",
    )
    sub.add_parser(
        "start", parents=[common, knobs], help="start the daemon (or report the running one)"
    )
    sub.add_parser("serve", parents=[common, knobs], help="run in the foreground")
    sub.add_parser("stop", parents=[common], help="stop the daemon")
    st = sub.add_parser(
        "status", parents=[common], help="is it running, where, with which key file"
    )
    st.add_argument("--json", action="store_true", help="print a JSON object")
    return p


def _options(ns: argparse.Namespace) -> daemon.ServeOptions:
    return daemon.ServeOptions.of(
        port=ns.port,
        time_scale=ns.time_scale,
        drain_window_s=ns.drain_window_s,
        provision_delay_s=ns.provision_delay_s,
        preemption_rate=ns.preemption_rate,
        seed=ns.seed,
        capacity_gpus=ns.capacity_gpus,
        chaos=ns.chaos,
        chaos_seed=ns.chaos_seed,
        chaos_delay_s=ns.chaos_delay_s,
        project_id=ns.project_id,
        rl_price_per_gpu_hour=ns.rl_price_per_gpu_hour,
        rl_models=ns.rl_models,
        rl_idle_scale=ns.rl_idle_scale,
        capacity_trace=None
        if ns.capacity_trace is None
        else str(Path(ns.capacity_trace).resolve()),
    )


def _asked(argv: list[str]) -> list[str]:
    """The `ServeOptions` fields given on the command line (parsed again with no defaults)."""
    parser = _parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for knob in sub._actions:
                    knob.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    return [name for name in daemon.ServeOptions().flat() if name in given]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = _parser().parse_args(argv)
    try:
        if ns.command == "serve":
            return daemon.serve(ns.home, _options(ns), ns.api_key)
        if ns.command == "start":
            st, started = daemon.start(ns.home, _options(ns), ns.api_key, asked=_asked(argv))
            print(("started" if started else "already running") + "\n" + st.describe())
            return 0
        if ns.command == "stop":
            stopped = daemon.stop(ns.home)
            print("emulator stopped" if stopped else "emulator was not running")
            return 0
        st = daemon.status(ns.home)
        if ns.json:
            print(
                json.dumps(
                    {
                        "running": st.running,
                        "pid": st.pid,
                        "base_url": st.base_url,
                        "key_file": str(st.home / "api_key"),
                        "log": str(st.log_path),
                        "state_dir": str(st.state_dir),
                    }
                )
            )
        else:
            print(st.describe())
        return 0 if st.running else 1
    except TgnbError as e:
        print(f"tgnb emulator: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
