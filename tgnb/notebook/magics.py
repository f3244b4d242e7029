"""``%tg`` and ``%%tg``: one thin router from a line onto `tgnb.Session`, `tgnb.runs.Run` and the
Post-Training handles.

``%load_ext tgnb`` registers the `Tg` magics. The subcommands (``%tg pt ...`` too) are one table,
`tgnb.notebook.commands.COMMANDS`, one module each: the router splits the line, looks the
subcommand up, parses its options (``%tg NAME --help`` shows them) and calls it; each makes one
call on the Python API; user errors (bad input, a run that does not exist, a
`tgnb.errors.TgnbError`) become one-line IPython `UsageError`s without a traceback, and nothing is
sent. Settings are traitlets: ``%config Tg.poll_interval = 2``, ``Tg.default_cluster``,
``Tg.timezone`` (for displayed times), ``Tg.standard_price`` and ``Tg.preemptible_price``.

This module is imported by ``%load_ext tgnb`` and must stay light: no torch, TRL, transformers,
kubernetes or pandas at import time.
"""

from __future__ import annotations

import sys
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
from tgnb.notebook._wording import as_magic, as_pt_magic
from tgnb.notebook.commands import COMMANDS, GROUPS, names, usage
from tgnb.notebook.commands.grammar import HelpShown, nearest, unknown_options
from tgnb.notebook.commands.pt import PtState

if TYPE_CHECKING:
    from tgnb.prices import Prices
    from tgnb.runs import Run
    from tgnb.session import Session


#: Longest ``%tg`` line read (characters); checked before any variable expansion.
MAX_LINE = 2000


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
        None,
        allow_none=True,
        help="Dollars per standard GPU-hour (default: the platform's, else the published rate).",
    ).tag(config=True)
    preemptible_price = Float(
        None,
        allow_none=True,
        help="Dollars per preemptible GPU-hour (default: the platform's, else the published rate).",
    ).tag(config=True)

    @validate("standard_price", "preemptible_price")
    def _check_price(self, proposal: Any) -> float | None:
        from tgnb.prices import check_price

        value = proposal["value"]
        if value is None:
            return None
        try:
            return check_price(value, proposal["trait"].name.removesuffix("_price"))
        except TgnbError as exc:
            raise TraitError(str(exc)) from None

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
        self._pt: PtState | None = None  # the %tg pt connection and resource, made on first use
        self._mine: dict[str, None] = {}  # ids of the runs launched or opened here, in order

    # -- routing -------------------------------------------------------------------------------
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
        group = ""
        if words and words[0] in GROUPS:
            group, words = words[0], words[1:]
            if cell is not None:
                raise UsageError(
                    f"%%tg {group} takes no cell body: write %tg {group} ... on one line"
                )
        where = f"%tg {group}" if group else "%tg"
        if not words or words[0] in ("-h", "--help", "help"):
            print(usage(group))
            return None
        name, rest = words[0], words[1:]
        command = COMMANDS.get(f"{group} {name}" if group else name)
        if command is None:
            hint = nearest(name, names(group))
            raise UsageError(
                f"{where}: unknown subcommand {name!r}{hint} ({where} --help lists them)"
            )
        if cell is not None and not command.takes_cell:
            raise UsageError(f"%%tg {name} takes no cell body: only %%tg launch has one (its YAML)")
        tail: list[str] = []
        if command.takes_cell and "--" in rest:  # a script's own arguments follow --
            cut = rest.index("--")
            rest, tail = rest[:cut], rest[cut + 1 :]
        parser = command.parser
        try:
            args, extras = parser.parse_known_args(rest)
        except HelpShown as h:
            print(h.text)
            return None
        if extras:
            raise unknown_options(parser.prog, extras, parser)
        args.script_args = tail
        if command.stores and args.out:
            self.check_out(args.out)  # before the call: a bad -o must not leave a run behind
        wording = as_pt_magic if group == "pt" else as_magic
        try:
            return command.module.run(self, args, cell)
        except TgnbError as e:
            raise UsageError(f"{parser.prog}: {wording(str(e))}") from None
        except UsageError as e:
            raise _prefixed(parser.prog, e) from None

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

    # -- what the subcommands work on (tgnb.notebook.commands) ---------------------------------
    @property
    def in_kernel(self) -> bool:
        """Whether a front end shows the displays (a Jupyter kernel, not a terminal IPython)."""
        return getattr(self.shell, "kernel", None) is not None

    def attached(self) -> Session:
        """The attached session; none is a UsageError that says how to attach."""
        if self.session is None:
            raise UsageError("no cluster attached: run %tg attach NAME (or %tg attach --local)")
        return self.session

    def prices(self) -> Prices | None:
        """The attached cluster's dollars per GPU-hour, ``%config Tg.*_price`` overriding."""
        return self.attached().prices(self.standard_price, self.preemptible_price)

    def find_run(self, name: str) -> Run:
        """The run `name` names: a variable holding a Run (``%tg launch ... -o run`` then
        ``%tg watch run``), else a run of the attached cluster by name or id."""
        session = self.attached()
        held = (getattr(self.shell, "user_ns", None) or {}).get(name)
        from tgnb.errors import NotFoundError
        from tgnb.runs import Run

        if isinstance(held, Run):
            run = held
        else:
            try:
                run = session.run(name)
            except (KeyError, NotFoundError):
                raise UsageError(
                    f"no run named {name!r}: %tg runs --all lists the cluster's runs"
                ) from None
        self.remember(run)
        return run

    def remember(self, run: Run) -> None:
        """Count `run` among the runs of this notebook (``%tg runs``, ``%tg cost``), in the
        kernel and, for a notebook the kernel knows by its path, in the tgnb home: a restarted
        kernel lists them again (`tgnb.notebook.remembered`)."""
        self._mine[run.id] = None
        where = self._notebook()
        if where is not None:
            from tgnb.notebook import remembered

            remembered.save(*where, [*remembered.load(*where), *self._mine])

    def _notebook(self) -> tuple[Any, str] | None:
        """(tgnb home, notebook path) where this notebook's runs are kept, or None."""
        from tgnb.notebook import remembered

        key = remembered.notebook_key(getattr(self.shell, "user_ns", None))
        return None if key is None or self.session is None else (self.session.home, key)

    def notebook_runs(self, every: bool) -> list[Run]:
        """The runs this notebook launched or opened (in that order, those of its earlier
        kernels first); with `every`, all the attached cluster's runs."""
        runs = self.attached().runs()
        if every:
            return runs
        by_id = {r.id: r for r in runs}
        ids = list(self._mine)
        where = self._notebook()
        if where is not None:
            from tgnb.notebook import remembered

            ids = list(dict.fromkeys([*remembered.load(*where), *ids]))
        return [by_id[i] for i in ids if i in by_id]

    def others(self, every: bool) -> int:
        """How many of the cluster's runs the default scope leaves out (0 with --all)."""
        return 0 if every else len(self.attached().runs()) - len(self.notebook_runs(False))

    def store(self, name: str | None, value: Any) -> None:
        """``-o NAME``: `value` into the user's namespace (the name checked by `check_out`)."""
        if name:
            self.shell.user_ns[name] = value  # type: ignore[union-attr]

    def pt_state(self) -> PtState:
        """The ``%tg pt`` connection and current resource of this kernel."""
        if self._pt is None:
            self._pt = PtState()
        return self._pt


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
    html = ipython.display_formatter.formatters["text/html"]  # by name: nothing imported now
    html.for_type_by_name("tgnb.runs.sweeps", "Sweep", _sweep_html)


def _sweep_html(sweep: Any) -> str:
    """A sweep shown in a cell: its table over its chart (`tgnb.notebook.sweep_view`)."""
    from tgnb.notebook.sweep_view import sweep_html

    return sweep_html(sweep)


def unload_ipython_extension(ipython: Any) -> None:
    """Remove the ``%tg`` magics."""
    ipython.magics_manager.magics["line"].pop("tg", None)
    ipython.magics_manager.magics["cell"].pop("tg", None)
    ipython.configurables[:] = [c for c in ipython.configurables if not isinstance(c, Tg)]
    if _refresh_panels in ipython.events.callbacks["post_run_cell"]:
        ipython.events.unregister("post_run_cell", _refresh_panels)


__all__ = ["Tg", "load_ipython_extension", "unload_ipython_extension"]
