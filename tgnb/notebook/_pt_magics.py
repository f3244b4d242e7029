"""``%tg pt ...``: the Post-Training API from a notebook line, a thin router onto
`tgnb.posttraining` (``%tg pt --help`` lists the subcommands, ``%tg pt NAME --help`` each one).

The magics work on one connection (the local emulator unless ``%tg pt connect --remote``) and one
current model resource (set by ``start`` or ``attach``; ``--resource ID`` names another). A bad line
is a one-line `UsageError` raised before anything is sent; tables display as HTML with a text/plain
fallback. Imported on the first ``%tg pt`` line, not by ``%load_ext tgnb``.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from IPython.core.error import UsageError

from tgnb.notebook._api import Table
from tgnb.notebook._parser import (
    HelpShown,
    _Parser,
    duration,
    name_arg,
    nearest,
    number,
    out_name,
    unknown_options,
    whole,
)


def _positive(text: str) -> int:
    n = whole(text)  # ASCII digits only
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return n


def _whole(text: str) -> int:
    """Any whole number in ASCII digits, signed: its range is the Python check's to say (it knows
    the model's)."""
    if not re.fullmatch(r"-?[0-9]{1,12}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: write e.g. 8")
    return int(text)


def build() -> dict[str, _Parser]:
    p: dict[str, _Parser] = {}

    def sub(name: str, help: str) -> _Parser:
        parser = _Parser(prog=f"%tg pt {name}", description=help, add_help=True)
        p[name] = parser
        return parser

    c = sub("connect", "Use the local emulator (default) or the real service (TOGETHER_API_KEY).")
    where = c.add_mutually_exclusive_group()
    where.add_argument("--local", dest="remote", action="store_false", default=False)
    where.add_argument("--remote", dest="remote", action="store_true")

    sub("models", "Base models the service can host (LoRA max rank, sequence length).")
    r = sub("resources", "This project's model resources (active ones unless --all).")
    r.add_argument("--all", action="store_true", help="also stopped ones")

    s = sub("start", "Start a model resource for a base model and wait until it is READY.")
    s.add_argument("model", help="base model, e.g. tgnb/tiny-llama (see %%tg pt models)")
    s.add_argument("--generators", type=_positive, default=1, help="generator replicas (0: none)")
    s.add_argument(
        "--inactive-timeout", type=duration, default=None, help="stop after idling, e.g. 15m"
    )
    s.add_argument("--full-weight", action="store_true", help="one full-weight session, no LoRA")
    s.add_argument(
        "-o", "--out", type=out_name, metavar="NAME", help="store the Resource under NAME"
    )

    a = sub("attach", "Make an existing model resource the current one.")
    a.add_argument("resource", type=name_arg, help="resource id (see %%tg pt resources)")
    a.add_argument(
        "-o", "--out", type=out_name, metavar="NAME", help="store the Resource under NAME"
    )

    ss = sub("sessions", "The training sessions of the current resource.")
    ss.add_argument("--resource", type=name_arg, help="another resource id")
    ss.add_argument("--active", action="store_true", help="only running ones")

    o = sub("open", "Open a training session (a LoRA adapter) on the current resource.")
    o.add_argument("--rank", type=_whole, help="LoRA rank, e.g. 8 (%%tg pt models: its maximum)")
    o.add_argument("--alpha", type=_whole, help="LoRA alpha, e.g. 16")
    o.add_argument("--dropout", type=number, help="LoRA dropout, e.g. 0.05")
    o.add_argument("--seed", type=_positive, help="LoRA init seed")
    o.add_argument("--name", help="display name, e.g. lr-1e-4")
    o.add_argument("--resume", metavar="CHECKPOINT", help="training checkpoint id to resume")
    o.add_argument("--resource", type=name_arg, help="another resource id")
    o.add_argument(
        "-o", "--out", type=out_name, metavar="NAME", help="store the TrainingSession under NAME"
    )

    st = sub(
        "stop", "Stop a session (--session) or the current resource (--force: its sessions too)."
    )
    st.add_argument("--session", type=name_arg, metavar="ID_OR_NAME", help="stop this session only")
    st.add_argument("--force", action="store_true", help="stop the resource's sessions too")
    st.add_argument("--resource", type=name_arg, help="another resource id")

    ck = sub("checkpoints", "Checkpoints of the current resource's sessions.")
    ck.add_argument("--resource", type=name_arg, help="another resource id")

    sv = sub("save", "Save a checkpoint of a session.")
    sv.add_argument("session", type=name_arg, metavar="ID_OR_NAME", help="the session")
    sv.add_argument("--kind", choices=["inference", "training"], default="inference")
    sv.add_argument("--resource", type=name_arg, help="another resource id")

    d = sub("download", "Download a checkpoint's files (adapter: LoRA weights; merged).")
    d.add_argument("checkpoint", type=name_arg, help="checkpoint id (see %%tg pt checkpoints)")
    d.add_argument("--variant", default="adapter", help="adapter (default) or merged")
    d.add_argument("--out", default=".", metavar="DIR", help="directory (default: .)")

    co = sub("cost", "GPU-minutes READY and their price so far.")
    co.add_argument("--resource", type=name_arg, help="another resource id")

    for name in ("panel", "watch"):
        w = sub(name, "A live panel of the current resource: sessions, curves, cost.")
        w.add_argument("--resource", type=name_arg, help="another resource id")

    ev = sub("events", "Lifecycle events of the current resource and its sessions.")
    ev.add_argument("--resource", type=name_arg, help="another resource id")
    ev.add_argument("--timeline", action="store_true", help="draw them as an EventTimeline")
    return p


_PARSERS = build()


def usage() -> str:
    lines = ["usage: %tg pt SUBCOMMAND [options]   (%tg pt SUBCOMMAND --help for each)", ""]
    lines += [f"  {n:<12} {p.description}" for n, p in _PARSERS.items()]
    return "\n".join(lines)


def _ts(t: Any, tz: str = "UTC") -> str:
    if t is None:
        return "-"
    from tgnb.notebook.timeline import _zone

    return str(t.astimezone(_zone(tz)).strftime("%Y-%m-%d %H:%M:%S"))


class PtCommands:
    """The state of ``%tg pt`` in one kernel: the connection and the current resource."""

    def __init__(self, magics: Any) -> None:
        self.magics = magics
        self.pt: Any = None
        self.resource: Any = None

    # -- routing -------------------------------------------------------------------------------
    def __call__(self, words: list[str]) -> Any:
        if not words or words[0] in ("-h", "--help", "help"):
            print(usage())
            return None
        name, rest = words[0], words[1:]
        parser = _PARSERS.get(name)
        if parser is None:
            hint = nearest(name, list(_PARSERS))
            raise UsageError(
                f"%tg pt: unknown subcommand {name!r}{hint} (%tg pt --help lists them)"
            )
        try:
            args, extras = parser.parse_known_args(rest)
        except HelpShown as h:
            print(h.text)
            return None
        if extras:
            raise unknown_options(parser.prog, extras, parser)
        out = getattr(args, "out", None)
        if name in ("start", "attach", "open") and out is not None:
            self.magics.check_out(out)
        handler = getattr(self, f"_do_{'panel' if name == 'watch' else name}")
        return handler(args)

    # -- helpers -------------------------------------------------------------------------------
    def handle(self, remote: bool | None = None) -> Any:
        if self.pt is None or remote is not None:
            from tgnb.posttraining import post_training

            self.pt = post_training(local=not remote)
        return self.pt

    def _resource(self, resource_id: str | None) -> Any:
        if resource_id:
            if self.resource is not None and self.resource.id == resource_id:
                return self.resource
            from tgnb.posttraining import validate

            validate.check_id(resource_id, "resource id", "%tg pt resources lists them")
            return self.handle().attach(resource_id)
        if self.resource is None:
            raise UsageError(
                "no current model resource: %tg pt start MODEL, or %tg pt attach RESOURCE_ID"
            )
        return self.resource

    def _store(self, name: str | None, value: Any) -> None:
        if name:
            self.magics.shell.user_ns[name] = value

    # -- subcommands ---------------------------------------------------------------------------
    def _do_connect(self, args: Any) -> None:
        pt = self.handle(remote=args.remote)
        self.resource = None
        print(f"Post-Training: {pt.conn.where} at {pt.conn.base_url}")

    def _do_models(self, args: Any) -> Table:
        rows = [
            (
                m.name,
                "yes" if m.lora else "no",
                str(m.max_lora_rank or "-"),
                "yes" if m.full else "no",
                str(m.max_seq_length or "-"),
                m.gpu_type,
            )
            for m in self.handle().models()
        ]
        head = ("MODEL", "LORA", "MAX RANK", "FULL WEIGHT", "MAX SEQ", "GPU")
        return Table(head, rows, "no supported models")

    def _do_resources(self, args: Any) -> Table:
        tz = self.magics.timezone
        rows = [
            (
                r.id,
                r.base_model,
                r.status + (f" (queue {r.queue_position})" if r.queue_position else ""),
                "LoRA" if r.lora_enabled else "full",
                str(r.generators),
                _ts(r.created_at, tz),
                _ts(r.expires_at, tz),
            )
            for r in self.handle().resources(all=args.all)
        ]
        head = ("RESOURCE", "MODEL", "STATUS", "KIND", "GENERATORS", "CREATED", "EXPIRES")
        return Table(head, rows, "no model resources: %tg pt start MODEL")

    def _do_start(self, args: Any) -> None:
        timeout = None
        if args.inactive_timeout is not None:
            timeout = int(args.inactive_timeout.total_seconds())
            if timeout < 1:
                raise UsageError("%tg pt start: --inactive-timeout must be at least 1s, e.g. 15m")
        res = self.handle().start(
            args.model,
            generators=args.generators,
            inactive_timeout=timeout,
            lora=not args.full_weight,
        )
        self.resource = res
        self._store(args.out, res)
        info = res.info()
        print(
            f"model resource {res.id} {info.status} ({info.base_model}, {info.generators} generator(s))"
        )

    def _do_attach(self, args: Any) -> None:
        res = self._resource(args.resource)
        info = res.info()
        self.resource = res
        self._store(args.out, res)
        print(f"current model resource: {res.id} {info.status} ({info.base_model})")

    def _do_sessions(self, args: Any) -> Table:
        rows = [
            (
                s.id,
                s.name or "-",
                s.status,
                str(s.step),
                str(s.policy_version),
                f"r{s.lora_rank}" if s.lora_rank else "full",
                str(len(s.checkpoints)),
                _ts(s.created_at, self.magics.timezone),
            )
            for s in self._resource(args.resource).sessions(active=args.active)
        ]
        head = ("SESSION", "NAME", "STATUS", "STEP", "POLICY", "LORA", "CKPTS", "CREATED")
        return Table(head, rows, "no sessions: %tg pt open --rank 8")

    def _do_open(self, args: Any) -> None:
        lora = {
            k: getattr(args, k)
            for k in ("rank", "alpha", "dropout", "seed")
            if getattr(args, k) is not None
        }
        from tgnb.posttraining import validate

        if args.resource is None and self.resource is not None:
            self.resource.check_lora(lora)  # the model's own rank range
        else:
            validate.check_lora(lora)  # before anything is sent, even the attach of --resource
        validate.check_name(args.name)
        res = self._resource(args.resource)
        sess = res.open_session(lora=lora or None, name=args.name, resume_from=args.resume)
        self._store(args.out, sess)
        label = f" {sess.name!r}" if sess.name else ""
        print(f"session {sess.id}{label} RUNNING on {res.id}")

    def _do_stop(self, args: Any) -> None:
        res = self._resource(args.resource)
        if args.session:
            if args.force:
                raise UsageError("%tg pt stop: --force stops a resource, not a session: drop it")
            info = res.session(args.session).stop()
            print(f"session {info.id} {info.status}")
            return
        info = res.stop(force=args.force)
        print(f"model resource {info.id} {info.status}")

    def _do_checkpoints(self, args: Any) -> Table:
        rows = [
            (c.id, c.kind, c.session_id, str(c.step), _ts(c.created_at, self.magics.timezone))
            for c in self._resource(args.resource).checkpoints()
        ]
        head = ("CHECKPOINT", "KIND", "SESSION", "STEP", "CREATED")
        return Table(head, rows, "no checkpoints: %tg pt save SESSION")

    def _do_save(self, args: Any) -> None:
        c = self._resource(args.resource).session(args.session).save(args.kind)
        print(f"{c.kind} checkpoint {c.id} at step {c.step}")

    def _do_download(self, args: Any) -> None:
        from tgnb.posttraining import validate

        validate.check_variant(args.variant)
        validate.check_out_dir(args.out)
        paths = self.handle().download(args.checkpoint, variant=args.variant, out=args.out)
        for path in paths:
            print(path)

    def _do_cost(self, args: Any) -> Table:
        c = self._resource(args.resource).cost()
        row = (
            c.resource_id,
            f"{c.minutes:.1f} {c.unit}",
            str(c.gpus),
            f"{c.gpu_minutes:.1f}",
            f"{c.price_per_hour:.2f} {c.currency}/h",
            f"{c.amount:.2f} {c.currency}" + (" (est.)" if c.estimated else ""),
        )
        head = ("RESOURCE", "READY", "GPUS", "GPU-MINUTES", "PRICE", "COST SO FAR")
        return Table(head, [row], caption=f"minutes and cost in {c.clock_note}")

    def _do_panel(self, args: Any) -> Any:
        from tgnb.notebook.pt_panel import ResourcePanel

        return ResourcePanel(self._resource(args.resource), poll_interval=self.magics.poll_interval)

    def _do_events(self, args: Any) -> Any:
        events = self._resource(args.resource).events()
        if args.timeline:
            from tgnb.notebook.timeline import EventTimeline

            return EventTimeline(events, tz=self.magics.timezone)
        from IPython.display import display

        from tgnb.notebook._api import EventsTable

        display(EventsTable(events, self.magics.timezone))
        return None


__all__ = ["PtCommands", "build", "usage"]
