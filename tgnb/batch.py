"""``tgnb notebooks``: run the example notebooks headless with papermill, keep what they showed.

Each notebook in ``notebooks/`` (the quickstart, the GRPO sweep, the DPO run, the Post-Training
recipes) has a cell tagged ``parameters``; `run_notebook` executes a copy with papermill (parameters injected after that cell),
writes the executed notebook and, by default, an HTML export (nbconvert) next to it. Widgets are
kept as their static HTML renderings and saved widget state, so the timeline, the panels and the
plots show in the output without a kernel.

Command line::

    tgnb notebooks list
    tgnb notebooks run quickstart --out tgnb-out          # tgnb-out/01-quickstart.ipynb and .html
    tgnb notebooks run all -p max_steps 10 --stop         # every notebook, then stop the emulator
    tgnb notebooks run grpo-sweep -p seed 1 --sweep seeds # its runs recorded as sweep "seeds"

papermill, nbconvert and ipykernel come with the ``batch`` extra (``pip install 'tgnb[batch]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tgnb.errors import TgnbError, ValidationError

#: Short names of the example notebooks and their files in the notebooks folder.
NOTEBOOKS: dict[str, str] = {
    "quickstart": "01-quickstart.ipynb",
    "grpo-sweep": "02-grpo-sweep.ipynb",
    "dpo": "03-dpo.ipynb",
    "pt-grpo": "04-post-training-grpo.ipynb",
    "multi-lora": "05-multi-lora.ipynb",
    "pt-dpo": "06-post-training-dpo.ipynb",
    "async-rl": "07-async-rl.ipynb",
}
#: Environment variable naming the folder that holds the example notebooks.
NOTEBOOKS_ENV = "TGNB_NOTEBOOKS"
DEFAULT_OUT = Path("tgnb-out")


class NotebookError(TgnbError):
    """A notebook raised while it ran; `output` is the executed notebook up to the failing cell."""

    def __init__(self, message: str, output: Path) -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class NotebookResult:
    """One executed notebook: where it was written, its HTML export, how long it ran."""

    source: Path
    output: Path
    html: Path | None
    seconds: float
    #: what the notebook's cells tagged ``check`` printed: its own verdict on what it ran
    #: (the quickstart's ``OK: 30/30 steps, 1 restart(s), 0 step(s) lost, ...``)
    verdict: tuple[str, ...] = ()

    def __str__(self) -> str:
        html = f", HTML {self.html}" if self.html else ""
        head = f"{self.source.name}: ran in {self.seconds:.0f} s; executed notebook {self.output}{html}"
        return "\n".join([head, *(f"  {line}" for line in self.verdict)])


def notebooks_dir() -> Path:
    """The folder of the example notebooks: ``$TGNB_NOTEBOOKS``; else ``notebooks/`` of the source
    tree tgnb runs from, or the copy a wheel ships as ``tgnb/_notebooks``."""
    env = os.environ.get(NOTEBOOKS_ENV)
    here = Path(__file__).resolve().parent
    candidates = (
        [Path(env).expanduser()] if env else [here.parent / "notebooks", here / "_notebooks"]
    )
    for folder in candidates:
        if (folder / NOTEBOOKS["quickstart"]).is_file():
            return folder
    raise ValidationError(
        f"no example notebooks in {candidates[0]}: set {NOTEBOOKS_ENV} to the notebooks/ folder "
        "of a tgnb checkout"
    )


def resolve(name: str) -> Path:
    """A notebook from a short name (``quickstart``), its number (``01``), its file name or a path."""
    path = Path(name).expanduser()
    if path.suffix == ".ipynb" and path.is_file():
        return path
    folder = notebooks_dir()
    for short, file in NOTEBOOKS.items():
        if name in (short, file, file.removesuffix(".ipynb"), file[:2]):
            return folder / file
    import difflib

    close = difflib.get_close_matches(name, list(NOTEBOOKS), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValidationError(
        f"no notebook {name!r}: {hint}choose from {', '.join(NOTEBOOKS)} or give an .ipynb path"
    )


def export_html(notebook: Path, html: Path | None = None) -> Path:
    """Write an HTML export of an executed notebook (nbconvert's lab template); its path."""
    import nbformat
    from nbconvert import HTMLExporter

    html = html or notebook.with_suffix(".html")
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    nb = nbformat.read(notebook, as_version=4)
    _static_widgets(nb)
    # one block per stream, a progress bar's redraws (``\r``) reduced to its last state
    nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
    body, _ = HTMLExporter().from_notebook_node(nb)
    html.write_text(body, encoding="utf-8")
    return html


def _kernel_manager() -> type:
    """papermill's kernel manager with CurveZMQ keys, so the kernel's sockets on loopback are
    encrypted (and ipykernel does not warn about plain-text TCP)."""
    import zmq
    from jupyter_client.manager import AsyncKernelManager

    class EncryptedKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if zmq.has("curve"):
                self.curve_publickey, self.curve_secretkey = zmq.curve_keypair()

    return EncryptedKernelManager


_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _static_widgets(nb: Any) -> None:
    """Outputs that carry a widget view and an HTML rendering keep only the HTML for the export:
    a page opened without a kernel (or without the CDN's require.js) shows the panel as it was
    last displayed instead of a blank widget area. The executed notebook keeps both."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if _WIDGET_VIEW in data and "text/html" in data:
                del data[_WIDGET_VIEW]


def run_notebook(
    notebook: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] = DEFAULT_OUT,
    parameters: Mapping[str, Any] | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    kernel: str | None = None,
    html: bool = True,
    cell_timeout: float | None = 1800,
    progress: bool = False,
    sweep: str | None = None,
) -> NotebookResult:
    """Execute one notebook with papermill into `out_dir` (same file name) and export it as HTML.

    `parameters` are injected after the cell tagged ``parameters``; `home` sets the notebook's
    ``home`` parameter (the tgnb home of its emulator and run store). `progress` shows a text
    progress bar on stderr (cell i of N, elapsed). `sweep`: every run the notebook's kernel
    launches joins that sweep of the run store (``session.sweep(name)`` shows them as one; the
    kernel reads it as ``$TGNB_SWEEP``). Raises `NotebookError` when a cell fails: the
    executed notebook (and its HTML) are still written, up to that cell.
    """
    from tgnb.runs.sweepstore import check_sweep_name
    from tgnb.session import SWEEP_ENV

    if sweep is not None:
        check_sweep_name(sweep)  # before any kernel starts: not after its runs have launched

    with _environ(SWEEP_ENV, sweep):
        return _run_notebook(
            notebook, out_dir, parameters, home, kernel, html, cell_timeout, progress
        )


@contextlib.contextmanager
def _environ(name: str, value: str | None) -> Iterator[None]:
    """``$name`` set to `value` (None: left as it is) for the kernels started inside."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def _run_notebook(
    notebook: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    parameters: Mapping[str, Any] | None,
    home: str | os.PathLike[str] | None,
    kernel: str | None,
    html: bool,
    cell_timeout: float | None,
    progress: bool,
) -> NotebookResult:
    import papermill as pm

    source = resolve(os.fspath(notebook))
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    output = out / source.name
    params = dict(parameters or {})
    if home is not None:
        params["home"] = os.fspath(Path(home).expanduser().resolve())
    t0 = time.monotonic()
    try:
        pm.execute_notebook(
            str(source),
            str(output),
            parameters=params,
            kernel_name=kernel,
            cwd=str(source.parent),
            progress_bar=_progress(source.name) if progress else False,
            execution_timeout=cell_timeout,
            kernel_manager_class=_kernel_manager(),
        )
    except pm.PapermillExecutionError as exc:
        if html:
            export_html(output)
        why = f"{exc.ename}: {exc.evalue}" if exc.evalue else _stderr_of(output, exc.exec_count)
        raise NotebookError(
            f"{source.name} failed in cell {exc.exec_count} ({why or exc.ename}); see {output}",
            output,
        ) from None
    seconds = time.monotonic() - t0
    exported = export_html(output) if html else None
    return NotebookResult(source, output, exported, seconds, verdict=_printed_by_checks(output))


def _printed_by_checks(notebook: Path) -> tuple[str, ...]:
    """The lines the cells tagged ``check`` printed on stdout, in order."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    lines: list[str] = []
    for cell in nb.cells:
        if "check" in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "stream" and out.get("name") == "stdout":
                    lines += [ln for ln in out.get("text", "").splitlines() if ln.strip()]
    return tuple(lines)


def _stderr_of(notebook: Path, exec_count: int | None) -> str:
    """The last stderr line of a failed cell (a magic's `UsageError` shows only there)."""
    import nbformat

    try:
        nb = nbformat.read(notebook, as_version=4)
    except (OSError, ValueError):
        return ""
    for cell in nb.cells:
        if cell.get("execution_count") == exec_count:
            text = "".join(
                o.get("text", "") for o in cell.get("outputs", []) if o.get("name") == "stderr"
            )
            lines = [line for line in text.splitlines() if line.strip()]
            return lines[-1] if lines else ""
    return ""


def _progress(name: str) -> dict[str, Any]:
    """papermill's tqdm bar as one line: ``01-quickstart.ipynb: cell 7 of 25 [00:41]``."""
    return {"desc": name, "bar_format": "{desc}: cell {n_fmt} of {total_fmt} [{elapsed}]"}


def _value(text: str) -> Any:
    """A ``-p`` value read as YAML (numbers, lists, booleans), else the string itself."""
    import yaml

    from tgnb.tasks.config import YAMLAliasError, load_yaml

    try:
        return load_yaml(text)
    except YAMLAliasError:
        raise ValidationError(
            f"-p value {text[:60]!r}: YAML anchors and aliases (&name, *name) are not "
            "accepted; write the value out"
        ) from None
    except yaml.YAMLError:
        return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tgnb notebooks", description="Run the example notebooks headless with papermill."
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the example notebooks and where they are")
    r = sub.add_parser("run", help="execute notebooks; keep the executed copies and HTML exports")
    r.add_argument("names", nargs="*", default=["quickstart"], help="names, or 'all'")
    r.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT, help="output folder")
    r.add_argument(
        "-p",
        "--parameter",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a notebook parameter (value read as YAML), e.g. -p max_steps 10",
    )
    r.add_argument("--home", type=Path, default=None, help="tgnb home (default $TGNB_HOME)")
    r.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebook's)")
    r.add_argument("--no-html", action="store_true", help="skip the HTML export")
    r.add_argument("--stop", action="store_true", help="stop the emulator daemon at the end")
    r.add_argument(
        "--sweep", default=None, metavar="NAME", help="record every run launched as sweep NAME"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "list":
            folder = notebooks_dir()
            for short, file in NOTEBOOKS.items():
                print(f"{short:<12} {folder / file}")
            return 0
        names = list(NOTEBOOKS) if args.names == ["all"] else args.names
        sources = [resolve(n) for n in names]  # every name checked before anything runs
        params = {k: _value(v) for k, v in args.parameter}
        failed = 0
        results: list[NotebookResult] = []
        with _owner_token() as owner:
            try:
                for source in sources:
                    try:
                        result = run_notebook(
                            source,
                            args.out,
                            params,
                            home=args.home,
                            kernel=args.kernel,
                            html=not args.no_html,
                            progress=True,
                            sweep=args.sweep,
                        )
                    except NotebookError as exc:
                        failed += 1
                        print(f"tgnb notebooks: {exc}", file=sys.stderr)
                        continue
                    results.append(result)
            finally:
                if args.stop:
                    _stop_own(args.home, owner)
                # the terminal ends with what was made, below the progress bars and --stop's line
                for result in results:
                    print(result, flush=True)
        return 1 if failed else 0
    except TgnbError as exc:
        print(f"tgnb notebooks: {exc}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _owner_token() -> Iterator[str]:
    """``$TGNB_EMULATOR_OWNER`` for the notebooks' kernels: an emulator they start is this
    command's, which it may restart (other options asked) and stop (``--stop``)."""
    from tgnb.config import EMULATOR_OWNER_ENV as OWNER_ENV

    before = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = before or secrets.token_hex(8)
    try:
        yield os.environ[OWNER_ENV]
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)


def _stop_own(home: Path | None, owner: str) -> None:
    """``--stop``: stop the emulator (and its runs) if this command started it, else say why not."""
    from tgnb import connection

    found = connection.find(home)
    if found is None:
        return
    if found.owner != owner:
        print(
            f"left the local emulator on {found.base_url} running: this command did not start "
            "it (`tgnb emulator stop` stops it)",
            flush=True,
        )
        return
    from tgnb.session import shutdown_local

    shutdown_local(home)
    print(f"stopped the local emulator on {found.base_url}", flush=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
