"""``%tg`` and ``%%tg``: a thin router from a line onto `tgnb.Session` and `tgnb.runs.Run`.

``%load_ext tgnb`` registers the `Tg` magics. Each subcommand parses its line (``%tg NAME --help``
shows how) and makes one call on the Python API; user errors (bad input, a run that does not exist, a
`tgnb.errors.TgnbError`) become one-line IPython `UsageError`s without a traceback, and nothing is
sent. Settings are traitlets: ``%config Tg.poll_interval = 2``, ``Tg.default_cluster``,
``Tg.timezone`` (for displayed times), ``Tg.standard_price`` and ``Tg.preemptible_price``.

This module is imported by ``%load_ext tgnb`` and must stay light: no torch, TRL, transformers,
kubernetes or pandas at import time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import (
    Magics,
    line_cell_magic,
    magics_class,
    needs_local_scope,
    no_var_expand,
)
from traitlets import Float, TraitError, Unicode, validate

from tgnb.errors import TgnbError
from tgnb.notebook import _api
from tgnb.notebook._parser import HelpShown, build, nearest, unknown_options
from tgnb.notebook._wording import as_magic, as_pt_magic

if TYPE_CHECKING:
    from tgnb.runs import Run
    from tgnb.session import Session


#: Longest ``%tg`` line read (characters); checked before any variable expansion.
MAX_LINE = 2000


def _display(obj: Any) -> None:
    from IPython.display import display

    display(obj)


@magics_class
class Tg(Magics):
    """The ``%tg`` magics. ``%tg --help`` lists the subcommands."""

    poll_interval = Float(2.0, help="Seconds between polls of live displays and --wait.").tag(
        config=True
    )
    default_cluster = Unicode("", help="Cluster name or id that `%tg attach` uses by default.").tag(
        config=True
    )
    timezone = Unicode(
        "UTC", help="Time zone of displayed times (IANA name, e.g. Europe/Paris)."
    ).tag(config=True)
    standard_price = Float(
        None, allow_none=True, help="Price of one standard GPU-hour, for `%tg cost`."
    ).tag(config=True)
    preemptible_price = Float(
        None, allow_none=True, help="Price of one preemptible GPU-hour, for `%tg cost`."
    ).tag(config=True)

    @validate("poll_interval")
    def _check_poll(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if value <= 0:
            raise TraitError(f"Tg.poll_interval must be > 0 seconds, got {value}: try 2")
        return value

    @validate("timezone")
    def _check_tz(self, proposal: Any) -> str:
        from zoneinfo import ZoneInfo

        value = str(proposal["value"])
        try:
            ZoneInfo(value)
        except (ValueError, KeyError, OSError):
            raise TraitError(
                f"Tg.timezone {value!r} is not a time zone: try 'UTC' or 'Europe/Paris'"
            ) from None
        return value

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell=shell, **kwargs)
        self.session: Session | None = None
        self._parsers = build()
        self._handlers: dict[str, Callable[[Any, str | None], Any]] = {
            name: getattr(self, f"_do_{name}") for name in self._parsers if name != "pt"
        }
        self._pt: Any = None  # tgnb.notebook._pt_magics.PtCommands, made on the first %tg pt
        self._mine: dict[str, None] = {}  # ids of the runs launched or opened here, in order

    # -- routing -------------------------------------------------------------------------------
    def usage(self) -> str:
        lines = ["%tg SUBCOMMAND [options]   (%tg SUBCOMMAND --help for each)", ""]
        for name, parser in self._parsers.items():
            lines.append(f"  {name:<9} {parser.description}")
        return "\n".join(lines)

    @line_cell_magic
    @no_var_expand
    @needs_local_scope
    def tg(self, line: str, cell: str | None = None, local_ns: Any = None) -> Any:
        """Control tgnb clusters and runs: ``%tg --help`` lists the subcommands."""
        import shlex

        line = self._expand(line, local_ns)
        try:
            words = shlex.split(_without_comment(line))
        except ValueError as e:
            raise UsageError(f"%tg: cannot split the line ({e}): check the quotes") from None
        if not words or words[0] in ("-h", "--help", "help"):
            print(self.usage())
            return None
        name, rest = words[0], words[1:]
        if name == "pt":
            return self._do_pt(rest, cell)
        parser = self._parsers.get(name)
        if parser is None:
            hint = nearest(name, list(self._parsers))
            raise UsageError(f"%tg: unknown subcommand {name!r}{hint} (%tg --help lists them)")
        if cell is not None and name != "launch":
            raise UsageError(f"%%tg {name} takes no cell body: only %%tg launch has one (its YAML)")
        tail: list[str] = []
        if name == "launch" and "--" in rest:  # a script's own arguments follow --
            cut = rest.index("--")
            rest, tail = rest[:cut], rest[cut + 1 :]
        try:
            args, extras = parser.parse_known_args(rest)
            args.script_args = tail
        except HelpShown as h:
            print(h.text)
            return None
        if extras:
            raise unknown_options(parser.prog, extras, parser)
        try:
            return self._handlers[name](args, cell)
        except TgnbError as e:
            raise UsageError(f"%tg {name}: {as_magic(str(e))}") from None
        except UsageError as e:
            raise _prefixed(f"%tg {name}", e) from None

    def _expand(self, line: str, local_ns: Any) -> str:
        """`line` with ``$name`` and ``{expr}`` expanded as IPython does for every magic, once
        it is known to be at most `MAX_LINE` characters: IPython's expansion takes time that
        grows faster than the line (a 200,000-character line took minutes), so the magic opts
        out of it (``@no_var_expand``) and does it itself after the length check."""
        if len(line) > MAX_LINE:
            raise UsageError(
                f"%tg: the line is {len(line):,} characters; at most {MAX_LINE:,} are read "
                "(put a run's config in a %%tg launch cell body)"
            )
        if "$" not in line and "{" not in line:
            return line
        from IPython.utils.text import DollarFormatter

        ns = dict(getattr(self.shell, "user_ns", None) or {})
        ns.update(local_ns or {})
        try:
            return str(DollarFormatter().vformat(line, args=[], kwargs=ns))
        except Exception:  # what IPython does: a line that does not expand is left as it is
            return line

    def check_out(self, out: str) -> None:
        """Refuse an ``-o`` name that IPython itself keeps in the namespace (``In``, ``Out``,
        ``_``, ``get_ipython``, ...): storing a run there would replace it."""
        hidden = getattr(self.shell, "user_ns_hidden", None) or {}
        if out in hidden:
            raise UsageError(f"-o {out!r} is a name IPython keeps for itself: try -o run1")

    def _do_pt(self, words: list[str], cell: str | None) -> Any:
        """``%tg pt ...``: the Post-Training subcommands (tgnb.notebook._pt_magics)."""
        if cell is not None:
            raise UsageError("%%tg pt takes no cell body: write %tg pt ... on one line")
        from tgnb.notebook._pt_magics import PtCommands

        if self._pt is None:
            self._pt = PtCommands(self)
        where = f"%tg pt {words[0]}" if words else "%tg pt"
        try:
            return self._pt(words)
        except TgnbError as e:
            raise UsageError(f"{where}: {as_pt_magic(str(e))}") from None
        except UsageError as e:
            raise _prefixed(where, e) from None

    # -- helpers -------------------------------------------------------------------------------
    def _session(self) -> Session:
        if self.session is None:
            raise UsageError("no cluster attached: run %tg attach NAME (or %tg attach --local)")
        return self.session

    def _run(self, name: str) -> Run:
        """The run `name` names: a variable holding a Run (``%tg launch ... -o run`` then
        ``%tg watch run``), else a run of the attached cluster by name or id."""
        session = self._session()
        held = (getattr(self.shell, "user_ns", None) or {}).get(name)
        from tgnb.runs import Run

        run = held if isinstance(held, Run) else _api.find_run(session, name)
        self._mine[run.id] = None
        return run

    def _runs(self, every: bool) -> list[Run]:
        """The runs this notebook launched or opened (in that order); with `every`, all the
        attached cluster's runs."""
        runs = self._session().runs()
        if every:
            return runs
        by_id = {r.id: r for r in runs}
        return [by_id[i] for i in self._mine if i in by_id]

    # -- subcommands ---------------------------------------------------------------------------
    def _do_attach(self, args: Any, cell: str | None) -> Any:
        target = args.cluster or self.default_cluster or None
        local = args.local or None  # no --local: the key decides (tgnb.attach's default)
        session = self.session = _api.attach(target, local=local, time_scale=args.time_scale)
        if session.emulator is not None:
            print(f"attached to the local emulator at {session.cloud.base_url}")
        return session

    def _do_clusters(self, args: Any, cell: str | None) -> Any:
        return _api.clusters(self.session)

    def _do_status(self, args: Any, cell: str | None) -> Any:
        return self._session().status()

    def _do_scale(self, args: Any, cell: str | None) -> Any:
        session = self._session()
        if not args.wait:
            return _api.scale(session, args.preemptible, wait=False)
        timeout = args.timeout.total_seconds() if args.timeout else None
        if getattr(self.shell, "kernel", None) is None:  # a terminal IPython: a text bar
            from tgnb.progress import CapacityBar

            bar = CapacityBar(args.preemptible)
            try:
                return _api.scale(
                    session, args.preemptible, wait=True, timeout=timeout, callback=bar.update
                )
            finally:
                bar.close()
        from tgnb.notebook.widgets import ClusterPanel

        panel = ClusterPanel(session, poll_interval=self.poll_interval, start=False)
        panel.show()  # its static fallback is brought up to date after the cell (post_run_cell)
        return _api.scale(
            session, args.preemptible, wait=True, timeout=timeout, callback=panel.update
        )

    def _do_launch(self, args: Any, cell: str | None) -> Any:
        from tgnb.notebook._launch import launch_request

        if args.out:
            self.check_out(args.out)  # before the launch: a bad -o must not leave a run behind
        algorithm, options = launch_request(args, cell)
        if args.dry_run:
            print(self._session().launch(algorithm, dry_run=True, **options), end="")
            return None
        run = self._session().launch(algorithm, **options)
        self._mine[run.id] = None
        if args.out:
            self.shell.user_ns[args.out] = run  # type: ignore[union-attr]
        return run

    def _do_runs(self, args: Any, cell: str | None) -> Any:
        return _api.runs_table(self._runs(args.all), every=args.all, others=self._others(args.all))

    def _others(self, every: bool) -> int:
        """How many of the cluster's runs the default scope leaves out (0 with --all)."""
        return 0 if every else len(self._session().runs()) - len(self._runs(False))

    def _do_watch(self, args: Any, cell: str | None) -> Any:
        from tgnb.notebook.widgets import RunPanel

        panel = RunPanel(self._run(args.run), poll_interval=self.poll_interval)
        if getattr(self.shell, "kernel", None) is None:
            return panel  # no front end to update: the caller shows it
        panel.show()  # displayed, not returned: its fallback is kept current after each cell
        return None

    def _do_logs(self, args: Any, cell: str | None) -> None:
        run = self._run(args.run)
        if not args.follow:
            print("\n".join(run.logs()))
            return
        try:
            for line in run.follow(poll=min(self.poll_interval, 0.5)):
                print(line, flush=True)
        except KeyboardInterrupt:
            print("(stopped following; the run goes on)")

    def _do_stop(self, args: Any, cell: str | None) -> None:
        run = self._run(args.run)
        run.stop()
        print(f"stop requested for run {run.name}")

    def _do_events(self, args: Any, cell: str | None) -> Any:
        session = self._session()
        since = _api.since(args.since)
        events = _api.filter_events(session.events(since=since), args.node, args.run)
        if args.timeline:
            from tgnb.notebook.timeline import EventTimeline

            return EventTimeline(events, tz=self.timezone)
        _display(_api.EventsTable(events, self.timezone))
        if not args.watch:
            return None
        seen = {e.key for e in events}
        try:
            while True:
                time.sleep(self.poll_interval)
                fresh = [
                    e
                    for e in _api.filter_events(session.events(since=since), args.node, args.run)
                    if e.key not in seen
                ]
                seen.update(e.key for e in fresh)
                if fresh:
                    print(_api.events_text(fresh, self.timezone, header=False), flush=True)
        except KeyboardInterrupt:
            return None

    def _do_preempt(self, args: Any, cell: str | None) -> Any:
        return _api.preempt(self._session(), args.node)

    def _do_cost(self, args: Any, cell: str | None) -> Any:
        return _api.cost(
            self._runs(args.all),
            self.standard_price,
            self.preemptible_price,
            scope=_api.scope_words(args.all, self._others(args.all)),
        )


def _without_comment(line: str) -> str:
    """`line` up to a ``#`` that starts a word outside quotes: IPython hands a line magic its
    trailing comment (``%tg watch run  # live``), which is for the reader, not the parser."""
    quote = None
    after_space = True
    for i, c in enumerate(line):
        if quote is not None:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and after_space:
            return line[:i]
        after_space = c.isspace()
    return line


def _prefixed(where: str, error: UsageError) -> UsageError:
    """`error` with its message starting with the subcommand (``%tg watch: ...``)."""
    message = str(error)
    if message.startswith(("%tg", "%%tg")):
        return error
    return UsageError(f"{where}: {message}")


def _refresh_panels(*args: Any) -> None:
    """After each cell: re-send the displays of shown panels whose state changed (only once a
    panel was made: widgets are not imported for this)."""
    widgets = sys.modules.get("tgnb.notebook.widgets")
    if widgets is not None:
        widgets.refresh_displays(*args)


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%tg``/``%%tg`` and make ``%config Tg.*`` reach them."""
    magics = Tg(shell=ipython)
    ipython.register_magics(magics)
    if magics not in ipython.configurables:
        ipython.configurables.append(magics)
    if _refresh_panels not in ipython.events.callbacks["post_run_cell"]:
        ipython.events.register("post_run_cell", _refresh_panels)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the ``%tg`` magics."""
    ipython.magics_manager.magics["line"].pop("tg", None)
    ipython.magics_manager.magics["cell"].pop("tg", None)
    ipython.configurables[:] = [c for c in ipython.configurables if not isinstance(c, Tg)]
    if _refresh_panels in ipython.events.callbacks["post_run_cell"]:
        ipython.events.unregister("post_run_cell", _refresh_panels)


__all__ = ["Tg", "load_ipython_extension", "unload_ipython_extension"]
