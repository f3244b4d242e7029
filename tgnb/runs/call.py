"""Functions run on a node, submitit-style: ``session.submit(fn, *args, **kwargs)`` and
``session.map(fn, items)`` (`Executor`), ``run.result()`` (`result`).

A submission is a run of the script kind like any other: the function and its arguments, pickled
by value with cloudpickle (`pack`), ship as one file of the run's workdir snapshot, and the node
runs ``python -m tgnb.train.call FILE`` (`tgnb.train.call`) once per node, as a command runs. The
runner calls the function and writes its value, or its exception with the node's traceback, to the
run directory (`RESULT`, replaced in one rename) and, for the engines whose run directory is not on
this machine, as an ``@tgnb`` record of kind `RESULT_KIND` in the log. A preemption ends the call
as it ends a script (the `tgnb.train.Checkpointer` saves and exits 75) and the next attempt calls
the function again, which resumes from its checkpoint.

What cannot reach a node is refused at submit, before anything is launched, with a
`NotPicklableError` naming the argument, closure variable or global and the fix: a live object of
this process (a lock, an open file, a socket, a thread, a process) or anything pickle refuses.
"""

from __future__ import annotations

import base64
import io
import pickle
import socket
import subprocess
import sys
import sysconfig
import threading
import types
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from tgnb.errors import CallError, NotPicklableError, ValidationError
from tgnb.events import parse_record

#: The node's runner module (``python -m tgnb.train.call FILE``).
RUNNER = "tgnb.train.call"
#: The run directory's file with the call's outcome (`tgnb.train.call.write_outcome`).
RESULT = "call-result.pkl"
#: The ``kind`` of the ``@tgnb`` log record that carries the outcome where the run directory is
#: not on this machine (Kubernetes); at most `RESULT_LOG_BYTES` of pickle.
RESULT_KIND = "call_result"
RESULT_LOG_BYTES = 512 * 1024
#: How the call's file in the snapshot is named (the name given to the runner).
FILE_PREFIX = "tgnb-call-"
#: A failed call is not started again by default (submitit's): ``recovery=`` changes it; a
#: preemption still restarts the call, uncounted.
DEFAULT_RECOVERY = {"max_restarts": 0}

#: Objects that live only in this process, in words.
_LIVE: tuple[tuple[type | tuple[type, ...], str], ...] = (
    ((type(threading.Lock()), type(threading.RLock())), "a thread lock"),
    (io.IOBase, "an open file"),
    (socket.socket, "a socket"),
    (threading.Thread, "a thread"),
    (subprocess.Popen, "a running process"),
    (types.GeneratorType, "a generator"),
)


class Followed(Protocol):
    """What is read of a `tgnb.runs.run.Run` here (it imports this module)."""

    @property
    def name(self) -> str: ...
    @property
    def run_dir(self) -> Path | None: ...
    @property
    def record(self) -> Any: ...
    def wait(self, timeout: float | None = ..., poll: float = ..., progress: bool = ...) -> Any: ...
    def logs(self, raw: bool = ...) -> list[str]: ...


def command(file: str) -> list[str]:
    """The node's command for the call in snapshot file `file`."""
    return ["python", "-m", RUNNER, file]


def is_call(train: Any) -> bool:
    """Whether a run's training config runs a submitted function (`command`)."""
    cmd = getattr(train, "command", None)
    return isinstance(cmd, list | tuple) and list(cmd[:3]) == command("")[:3]


class _Live(Exception):
    def __init__(self, obj: object, what: str) -> None:
        super().__init__(what)
        self.obj, self.what = obj, what


def _pickler_class() -> type:
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        """cloudpickle's, refusing the objects that live only in this process (cloudpickle
        would copy an open file's contents, and fail later on the rest)."""

        def reducer_override(self, obj: Any) -> Any:
            if obj not in (sys.stdout, sys.stderr, sys.stdin):
                for kinds, what in _LIVE:
                    if isinstance(obj, kinds):
                        raise _Live(obj, what)
            return super().reducer_override(obj)

    return Pickler


def dumps(obj: Any) -> bytes:
    """`obj` pickled by cloudpickle, live objects refused (`_Live`)."""
    buf = io.BytesIO()
    _pickler_class()(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _installed(module: types.ModuleType) -> bool:
    """Whether `module` is the standard library's or an installed distribution's (pickled by
    reference: the node imports its own copy)."""
    from importlib.metadata import packages_distributions

    top = module.__name__.partition(".")[0]
    if top in ("tgnb", *sys.stdlib_module_names) or top in packages_distributions():
        return True
    file = getattr(module, "__file__", None)
    if not file:
        return True  # built in
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(Path(file).resolve().is_relative_to(r) for r in roots)


def _by_value(fn: Callable[..., Any], workdir: Path) -> types.ModuleType | None:
    """The function's module when it must travel by value: neither ``__main__`` (a notebook's
    cell, by value anyway), nor installed, nor in the workdir the snapshot ships."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or module.__name__ == "__main__" or _installed(module):
        return None
    file = getattr(module, "__file__", None)
    if file and Path(file).resolve().is_relative_to(workdir.resolve()):
        return None
    return module


def _globals_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _globals_used(const)
    return names


def _parts(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list:
    """(where, object) for each thing sent, in the words of a refusal."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    out: list[tuple[str, Any]] = []
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType):
        cells = getattr(fn, "__closure__", None) or ()
        for var, cell in zip(code.co_freevars, cells, strict=False):
            try:
                out.append((f"{name}'s closure variable {var!r}", cell.cell_contents))
            except ValueError:  # an empty cell
                continue
        glb = getattr(fn, "__globals__", {})
        for var in sorted(_globals_used(code)):
            if var in glb and not isinstance(glb[var], types.ModuleType):
                out.append((f"the global {var!r} that {name} uses", glb[var]))
    out += [(f"argument {i + 1} of {name}", a) for i, a in enumerate(args)]
    out += [(f"keyword argument {k!r} of {name}", v) for k, v in kwargs.items()]
    return out


def _refusal(where: str, exc: BaseException) -> NotPicklableError:
    if isinstance(exc, _Live):
        kind = type(exc.obj).__name__
        return NotPicklableError(
            f"{where} is {exc.what} ({kind}), which lives only in this process and cannot be "
            "sent to a node: create it inside the function (pass a file's path, not the file)"
        )
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return NotPicklableError(
        f"{where} cannot be pickled ({type(exc).__name__}: {first}): pass plain data (numbers, "
        "strings, lists, dicts, arrays, tensors) or create it inside the function"
    )


def pack(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any], workdir: Path
) -> bytes:
    """The call ``fn(*args, **kwargs)`` pickled for the node (`NotPicklableError` naming what
    cannot go, and the fix). The function's module travels by value unless it is installed or in
    `workdir` (shipped with the run)."""
    import cloudpickle

    if not callable(fn):
        raise ValidationError(
            f"submit takes a function and its arguments, got {type(fn).__name__} first: "
            "session.submit(fn, *args, **kwargs)"
        )
    module = _by_value(fn, workdir)
    if module is not None:
        cloudpickle.register_pickle_by_value(module)
    try:
        try:
            data = dumps((fn, tuple(args), dict(kwargs)))
        except Exception as exc:  # which part: the function's closure and globals, or an argument
            for where, obj in _parts(fn, args, kwargs):
                try:
                    dumps(obj)
                except Exception as part:
                    raise _refusal(where, part) from None
            name = getattr(fn, "__qualname__", None) or repr(fn)
            raise _refusal(f"the function {name}", exc) from None
    finally:
        if module is not None:
            cloudpickle.unregister_pickle_by_value(module)
    from tgnb.config import holds_secret_bytes, register_env_secrets

    register_env_secrets()
    if holds_secret_bytes(data):
        raise NotPicklableError(
            "the function or its arguments hold a secret tgnb knows (an API key or token): read "
            "it on the node from the environment instead, and launch with secrets="
        )
    return data


def _valid_name(text: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return "-".join(p for p in out.split("-") if p)[:36].strip("-") or "call"


class Executor:
    """submitit's executor over `launch` (`Session.launch`) with launch options `options` (name,
    gpus_per_node, nodes, preemptible, recovery, env, secrets, workdir, budget_usd...):
    ``submit(fn, *args, **kwargs)`` launches one run, ``map(fn, *iterables)`` one run per item."""

    def __init__(
        self,
        launch: Callable[..., Any],
        options: Mapping[str, Any],
        group: Callable[[str, list[Any]], Any] | None = None,
    ) -> None:
        self._launch = launch
        self.options = dict(options)
        self._group = group  # map's runs as one sweep (`Session.sweep`): group(name, runs)

    def _workdir(self) -> Path:
        from tgnb.runs.workdir import default_workdir

        given = self.options.get("workdir")
        return Path(given).expanduser() if given is not None else default_workdir()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Launch ``fn(*args, **kwargs)`` on a node; its `tgnb.runs.run.Run` (``run.result()``)."""
        data = pack(fn, args, kwargs, self._workdir())
        return self._start(fn, data, self.options.get("name"))

    def map(self, fn: Callable[..., Any], /, *iterables: Iterable[Any]) -> Any:
        """One run per item: ``fn(a, b)`` for each ``(a, b)`` of ``zip(*iterables)`` (submitit's
        ``map_array``); every call is pickled first, so a refusal launches nothing. Their runs,
        in order, named ``NAME-0``, ``NAME-1``..., as one sweep named ``NAME`` when the
        executor groups them (a session's: `tgnb.runs.sweeps.Sweep`; the runs launched before a
        launch that failed are recorded in it too), else as a list."""
        if not iterables:
            raise ValidationError("map takes a function and one iterable or more: map(fn, items)")
        workdir = self._workdir()
        calls = [pack(fn, tuple(items), {}, workdir) for items in zip(*iterables, strict=False)]
        base = self.options.get("name") or f"{_valid_name(_fn_name(fn))}-{uuid.uuid4().hex[:4]}"
        runs: list[Any] = []
        try:
            for i, data in enumerate(calls):
                runs.append(self._start(fn, data, f"{base}-{i}"))
        finally:
            grouped = self._group(base, runs) if self._group is not None and runs else runs
        return grouped

    def _start(self, fn: Callable[..., Any], data: bytes, name: str | None) -> Any:
        file = f"{FILE_PREFIX}{uuid.uuid4().hex[:12]}.pkl"
        options = dict(self.options)
        options["name"] = name or f"{_valid_name(_fn_name(fn))}-{uuid.uuid4().hex[:6]}"
        options.setdefault("recovery", dict(DEFAULT_RECOVERY))
        options.setdefault("workdir", self._workdir())
        return self._launch(command=command(file), files={file: data}, **options)


def _fn_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


def outcome(run: Followed) -> dict[str, Any] | None:
    """The call's outcome as its runner wrote it (``kind``: "value" or "error", ``pickle``: the
    value or the exception, ``traceback``, ``node``), or None when none was written."""
    d = run.run_dir
    if d is not None and d.is_dir():
        path = d / RESULT
        return pickle.loads(path.read_bytes()) if path.exists() else None
    for line in reversed(run.logs(raw=True)):
        record = parse_record(line)
        if record is not None and record.get("kind") == RESULT_KIND:
            return pickle.loads(base64.b64decode(str(record.get("outcome", ""))))
    return None


def result(run: Followed, timeout: float | None = None) -> Any:
    """Wait for the submitted call's run to end; the function's value, or its exception raised
    again with the node's traceback added as a note (`CallError` when the run ended without
    either: cancelled, killed, an exception that cannot be read back here)."""
    if not is_call(run.record.spec.train):
        raise ValidationError(
            f"run {run.name!r} runs no submitted function, so it has no result: run.wait() waits "
            "for it, run.summary() says what it did"
        )
    st = run.wait(timeout=timeout, progress=False)
    out = outcome(run)
    if out is None:
        detail = f" ({st.detail})" if st.detail else ""
        raise CallError(
            f"run {run.name!r} {st.state.value}{detail} before its function returned: no "
            "result (run.logs() shows its output)"
        )
    where = f"on node {out.get('node') or '?'} of run {run.name!r}"
    try:
        value = pickle.loads(out["pickle"]) if out.get("pickle") is not None else None
    except Exception as exc:
        raise CallError(
            f"the function's {'value' if out['kind'] == 'value' else 'exception'} {where} cannot "
            f"be read back here ({type(exc).__name__}: {exc}); its traceback:\n"
            f"{out.get('traceback') or ''}"
        ) from None
    if out["kind"] == "value":
        return value
    trace = str(out.get("traceback") or "").rstrip()
    if isinstance(value, BaseException):
        value.add_note(f"raised {where}; the node's traceback:\n{trace}")
        raise value
    raise CallError(f"the function failed {where}:\n{trace}")


__all__ = [
    "DEFAULT_RECOVERY",
    "FILE_PREFIX",
    "RESULT",
    "RESULT_KIND",
    "RUNNER",
    "Executor",
    "command",
    "is_call",
    "outcome",
    "pack",
    "result",
]
