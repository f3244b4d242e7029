"""What `Session.launch` makes of its arguments before anything is recorded or sent: one
`LaunchPlan` (`plan`) holding the run's contract (a `RunSpec`, valid by construction), the workdir
snapshot it ships (taken once, `tgnb.runs.workdir.take`) and the preemption estimate, after every
check that can fail at launch rather than on the node.

- ``launch("grpo" | "dpo" | "sft")``: a built-in algorithm on the built-in tiny task;
- ``launch("train.py", args=[...])``: a script of the workdir (a path ending in ``.py``);
- ``launch(command=["accelerate", "launch", "train.py"])``: a command run in the workdir;
- ``launch("run.yaml")`` or a mapping: a config, built-in or ``algorithm: script``.

The workdir (`tgnb.runs.workdir`) goes with every script run, and with a built-in run that reads
from it (a relative dataset path, a reward module found there) or names one (``workdir=``).

The checks (`check`) read the snapshot, not the live folder: what was checked is what the node
gets. They run in the notebook's process and without importing torch or TRL there: the
light ones (`tgnb.tasks.config.check_light`: types, ranges of common TRL options, the model,
datasets resolved against the workdir with the columns the algorithm reads, the checkpoint
policy); the script exists and compiles; and, when the config names something only TRL or the
user's code can answer for (a TRL or LoRA option, a reward module), ``python -m tgnb.train
run.json --check`` in a subprocess run in the workdir, given a run file as a node is
(`tgnb.runs.runfile`): like a node, it trusts the light checks made here and makes the rest --
TRL option names (``Did you mean 'learning_rate'?``), reward modules importable there with a
signature TRL accepts.

With ``checkpoint.auto`` on preemptible nodes, the preemption rate it weighs comes from the
cluster's own history (`observed_preemption_rate`), the setting being the prior.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tgnb.errors import TrainConfigError, ValidationError
from tgnb.runs import call, ftcheck
from tgnb.runs import workdir as wd
from tgnb.runs.outcome import UNPROTECTED
from tgnb.runs.replicas import UNPROTECTED_GROUPS
from tgnb.runs.spec import RunSpec
from tgnb.runs.trainconfig import ALGORITHMS as BUILTIN
from tgnb.runs.trainconfig import SCRIPT, TrainConfig, from_dict

if TYPE_CHECKING:
    from tgnb.cloud import ClusterState

CHECK_TIMEOUT_S = 300.0


def _config_file(text: str) -> dict[str, Any]:
    import yaml

    from tgnb.tasks.config import load_yaml

    path = Path(text).expanduser()
    if not path.is_file():
        raise ValidationError(
            f"{text!r} is neither an algorithm ({', '.join(BUILTIN)}), a script (a .py file), "
            "nor a YAML config file that exists"
        )
    try:
        loaded = load_yaml(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise ValidationError(
            f"config file {str(path)!r} is not plain YAML ({first}): python tags, other "
            "custom tags, anchors and aliases are refused; write plain keys and values"
        ) from None
    if not isinstance(loaded, dict):
        raise ValidationError(f"config file {str(path)!r} must hold a mapping of keys to values")
    return loaded


def train_config(
    what: str | os.PathLike[str] | Mapping[str, Any] | None,
    *,
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> tuple[dict[str, Any], Path | None]:
    """The run's training config mapping and the workdir it takes (None: none is shipped)."""
    given = None if workdir is None else Path(workdir).expanduser().resolve()
    if command is not None:
        if what is not None:
            raise ValidationError("give a script or command=, not both")
        if isinstance(command, str) or not all(isinstance(w, str) for w in command):
            raise ValidationError(
                "command must be a list of strings, e.g. command=['accelerate', 'launch', 'x.py']"
            )
        return {"algorithm": "script", "command": list(command)}, given or wd.default_workdir()
    if what is None:
        raise ValidationError(
            "say what to run: launch('grpo'), launch('train.py', args=[...]) or "
            "launch(command=[...])"
        )
    if isinstance(what, Mapping):
        train = dict(what)
    elif str(what).lower() in BUILTIN:
        train = {"algorithm": str(what).lower(), "model": "tiny"}
    elif str(what).endswith(".py"):
        root = given or wd.default_workdir()
        script = Path(what).expanduser()
        if script.is_absolute():
            if given is None:
                root = script.resolve().parent
            try:
                script = script.resolve().relative_to(root)
            except ValueError:
                raise ValidationError(
                    f"script {str(what)!r} is not inside the workdir {str(root)!r}: pass "
                    "workdir= the folder that holds it"
                ) from None
        train = {"algorithm": "script", "script": script.as_posix()}
        if args is not None:
            if isinstance(args, str) or not all(_is_arg(a) for a in args):
                raise ValidationError("args must be a list of strings, e.g. args=['--lr', '1e-4']")
            train["args"] = [str(a) for a in args]  # a number given reaches the script as text
        return train, root
    else:
        train = _config_file(str(what))
    if args is not None:
        raise ValidationError("args= go with a script: launch('train.py', args=[...])")
    if "algorithm" not in train and (train.get("script") or train.get("command")):
        train["algorithm"] = "script"  # ``script: train.py`` alone, as docs/own-code.md shows it
    if train.get("algorithm") == "script":
        return train, given or wd.default_workdir()
    return train, given


def _is_arg(word: Any) -> bool:
    return isinstance(word, str) or (isinstance(word, int | float) and not isinstance(word, bool))


#: Config keys a script or command run never reads (they configure the built-in runs).
NOT_FOR_A_SCRIPT = (
    "model",
    "dataset",
    "dataset_config",
    "dataset_split",
    "dataset_size",
    "rewards",
    "trl",
    "lora",
    "max_steps",
)


def _check_script_keys(train: dict[str, Any]) -> None:
    """A script run given a key only the built-in runs read is refused (it was ignored); its
    numeric arguments become the text the script reads."""
    if train.get("algorithm") != "script":
        return
    if isinstance(train.get("args"), list):  # a %%tg launch body's 1e-4 is read as a number
        train["args"] = [str(a) if _is_arg(a) else a for a in train["args"]]
    given = [key for key in NOT_FOR_A_SCRIPT if key in train]
    if given:
        key = given[0]
        raise ValidationError(
            f"{key}= does not apply to a script (only the built-in runs read it): pass it to "
            f"your program as an argument, e.g. args=['--{key.replace('_', '-')}', ...], "
            f"and drop {key}="
        )


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `extra`'s keys set, mappings merged key by key (``checkpoint={...}`` adds to
    the config's ``checkpoint:``)."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = merge(dict(base[key]), value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value
    return base


@dataclass(frozen=True)
class LaunchPlan:
    """A launch, checked: the run's `spec` (with the `snapshot` it ships) and the line that says
    where ``checkpoint.auto``'s preemption rate came from (`estimate`, None without ``auto``).
    `discard` removes the staged snapshot once the engine has written it where the run reads it."""

    spec: RunSpec
    snapshot: wd.Snapshot | None
    estimate: str | None
    #: the launch's warning for a program with no hook (`unprotected`), or None
    warning: str | None = None

    def resolved(self, run_dir: str | None = None) -> str:
        """The config as the node will run it, as YAML (`resolved`)."""
        root = None if self.snapshot is None else self.snapshot.root
        return resolved(self.spec.train, root, run_dir)

    def discard(self) -> None:
        if self.snapshot is not None:
            self.snapshot.discard()


def plan(
    what: str | os.PathLike[str] | Mapping[str, Any] | None,
    *,
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    name: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    state: Callable[[], ClusterState] | None = None,
    files: Mapping[str, bytes] | None = None,
    **spec_fields: Any,
) -> LaunchPlan:
    """The `LaunchPlan` of a launch (see the module docstring): the training config from `what`
    (or `command`) with `overrides` merged, the workdir snapshotted once, the spec built (it
    checks itself) from `spec_fields` (`RunSpec`'s: resources, env, secrets, recovery...), every
    check run on the snapshot, then the estimate made on preemptible nodes from the cluster's
    `state` (called only then: bad input sends no request), the spec then weighing it. `files`
    are written into the snapshot beside the workdir's (`Snapshot.with_files`). On bad input a
    `ValidationError` (or `TrainConfigError`) and nothing left behind."""
    base, root = train_config(what, command=command, args=args, workdir=workdir)
    train = merge(base, overrides or {})
    _check_script_keys(train)
    if name is None:  # a config's own name: (a YAML file, a %%tg launch body)
        name = train.get("name")
    if name is not None and not isinstance(name, str):
        raise ValidationError(f"name must be a string such as 'grpo-1', got {name!r:.60}")
    if root is None and reads_workdir(train, wd.default_workdir()):
        root = wd.default_workdir()
    name = name or f"{train.get('algorithm', 'grpo')}-{uuid.uuid4().hex[:6]}"
    train["name"] = name
    snapshot = None if root is None else wd.take(root)
    try:
        if files and snapshot is not None:
            snapshot = snapshot.with_files(files)
        spec = RunSpec(
            name=name,
            train=from_dict(train),
            workdir=None if root is None else os.fspath(root),
            snapshot=snapshot,
            **spec_fields,
        )
        cfg = spec.train
        ftcheck.check(spec)  # replica groups (issue 50): what no engine can run as such
        if snapshot is not None:
            _check_shipped(cfg, snapshot)
        paths = [p for p in spec.env.get("PYTHONPATH", "").split(os.pathsep) if p]
        check(cfg, None if snapshot is None else snapshot.root, paths)
        check_mlflow_store(cfg, spec.env)
        res = spec.resources
        estimate = None
        if state is not None and res.preemptible:  # auto weighs what this cluster's nodes saw
            cfg, estimate = observed_preemption_rate(cfg, state(), res.nodes)
            if estimate is not None:
                spec = replace(spec, train=cfg)
    except BaseException:
        if snapshot is not None:
            snapshot.discard()
        raise
    return LaunchPlan(spec, snapshot, estimate, unprotected(cfg, snapshot))


#: MLflow tracking URIs that are not its file store (which MLflow 3 refuses to open).
_MLFLOW_NOT_FILES = re.compile(r"^(sqlite|postgresql|mysql|mssql|https?|databricks|uc)[:+]", re.I)


def _reports_to_mlflow(cfg: TrainConfig) -> bool:
    report_to = cfg.trl.get("report_to")
    names = [report_to] if isinstance(report_to, str) else list(report_to or ())
    return any(str(n).strip().lower() in ("mlflow", "all") for n in names)


def check_mlflow_store(cfg: TrainConfig, env: Mapping[str, str]) -> None:
    """Refuse, in one line naming the fix, a run whose MLflow tracking URI is MLflow's file store
    (``file:...`` or a plain path): MLflow 3 refuses to open it unless ``MLFLOW_ALLOW_FILE_STORE``
    is true, so the node would fail at every start. Checked for a built-in run whose
    ``trl.report_to`` names ``mlflow`` (or ``all``), with the URI of the run's `env` or else of
    this process (which the node inherits), and for any run whose own `env` sets the URI."""
    given = "MLFLOW_TRACKING_URI" in env
    if not given and not _reports_to_mlflow(cfg):
        return
    uri = env.get("MLFLOW_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI") or ""
    allow = env.get("MLFLOW_ALLOW_FILE_STORE", os.environ.get("MLFLOW_ALLOW_FILE_STORE", ""))
    if not uri or _MLFLOW_NOT_FILES.match(uri) or allow.strip().lower() in ("1", "true"):
        return  # unset: MLflow's default, sqlite:///mlflow.db in the working directory
    path = uri.removeprefix("file://").removeprefix("file:")
    raise ValidationError(
        f"MLFLOW_TRACKING_URI={uri!r:.120} is MLflow's file store, which MLflow refuses to open: "
        f"use a database, MLFLOW_TRACKING_URI='sqlite:///{os.path.abspath(path or '.')}/mlflow.db' "
        "(or set MLFLOW_ALLOW_FILE_STORE=true)"
    )


#: What a program with a hook names: `tgnb.train.protect` or the `Checkpointer`.
_HOOKS = re.compile(r"\b(protect|Checkpointer)\b")
_SCAN_BYTES = 2_000_000


def unprotected(train: TrainConfig, snapshot: wd.Snapshot | None) -> str | None:
    """The launch's warning for a script or command whose workdir never names
    ``tgnb.train.protect`` or the ``Checkpointer`` (no ``RunStarted`` will come: a preemption
    restarts it from step 0), or None. A plain text scan of the snapshot's Python files."""
    if train.algorithm != SCRIPT:
        return None
    what = train.script or " ".join(train.command or ())
    if call.is_call(train):
        what = "the submitted function"
    if snapshot is not None:
        read = 0
        for rel in snapshot.files:
            if not rel.endswith(".py") and not rel.startswith(call.FILE_PREFIX):
                continue  # a submitted function's pickle holds the names its code uses
            if read > _SCAN_BYTES:
                continue
            try:
                text = (snapshot.root / rel).read_text(encoding="latin-1")
            except OSError:
                continue
            read += len(text)
            if "tgnb" in text and _HOOKS.search(text):
                return None
    if train.fault_tolerance:  # replica groups: a preempted group heals, it does not restart
        return (
            f"tgnb: {what} is {UNPROTECTED_GROUPS}: use "
            "tgnb.train.Checkpointer(..., fault_tolerant=True) for periodic checkpoints too"
        )
    return (
        f"tgnb: {what} is {UNPROTECTED}: call tgnb.train.protect(trainer), or use "
        "tgnb.train.Checkpointer in a plain loop, to checkpoint on a preemption and resume"
    )


def _nearest(script: str, files: Sequence[str]) -> str:
    """The fix for a script name not found: the closest ``.py`` file of the workdir, if any."""
    import difflib

    scripts = {f.removesuffix(".py"): f for f in files if f.endswith(".py")}  # ".py" alike
    close = difflib.get_close_matches(script.removesuffix(".py"), scripts, n=1, cutoff=0.7)
    if close:
        return f"did you mean {scripts[close[0]]!r}?"
    return "give the path of a script inside it (relative to it), or pass workdir= its folder"


def _check_shipped(train: TrainConfig, snapshot: wd.Snapshot) -> None:
    """The script is in the snapshot, not only in the folder (an ignore pattern took it out)."""
    script = train.script
    shipped = not isinstance(script, str) or script in snapshot.files
    if not shipped and (Path(str(script)).is_absolute() or ".." in Path(str(script)).parts):
        raise ValidationError(
            f"script {script!r} is outside the workdir {str(snapshot.folder)!r}, which is what "
            "the node gets: move it into the workdir, or make its folder the workdir "
            "(workdir=..., --workdir)"
        )
    if not shipped and not (snapshot.folder / str(script)).exists():
        raise TrainConfigError(f"script {script!r} is not in the workdir {str(snapshot.folder)!r}"
                               f": {_nearest(str(script), snapshot.files)}")  # fmt: skip
    if not shipped and (snapshot.folder / str(script)).is_file():
        raise ValidationError(
            f"script {script!r} is in {str(snapshot.folder)!r} but left out of the snapshot "
            f"the node gets (a pattern of {wd.IGNORE_FILE} or the defaults matches it): "
            f"change {wd.IGNORE_FILE} so that it ships"
        )


def reads_workdir(train: Mapping[str, Any], root: Path) -> bool:
    """Whether a built-in run reads from `root`: a relative local dataset, a reward module there."""
    from tgnb.tasks import data

    dataset = train.get("dataset")
    if isinstance(dataset, str) and data.columns_known_locally(dataset):
        path = Path(dataset).expanduser()
        if not path.is_absolute() and (root / path).exists():
            return True
    rewards = train.get("rewards") or ()
    return any(isinstance(r, str) and ":" in r and wd.provides(root, r) for r in rewards)


def _needs_subprocess(cfg: TrainConfig) -> bool:
    custom = [r for r in cfg.rewards if ":" in r] if cfg.algorithm == "grpo" else []
    return bool(cfg.trl or cfg.lora or custom)


def check(cfg: TrainConfig, root: Path | None, paths: Sequence[str] = ()) -> None:
    """Every launch-time check of the run's config (see the module docstring); a
    `TrainConfigError` with the first problem, nothing recorded or sent. `paths`: the run's own
    ``PYTHONPATH`` (where a script's imports may be found)."""
    from tgnb.tasks import config

    base = root or Path.cwd()
    config.check_light(cfg, base)
    if cfg.algorithm == config.SCRIPT:
        config.check_script(cfg, base, paths)
        return
    if _needs_subprocess(cfg):
        check_on_a_node_like_process(cfg, base)


def resolved(train: TrainConfig, root: Path | None, run_dir: str | None = None) -> str:
    """The config as the node will run it (tgnb's own defaults under ``trl`` included), as YAML:
    what ``tgnb train --check`` prints, run in the workdir (nothing is written)."""
    return check_on_a_node_like_process(train, root or Path.cwd(), run_dir)


def check_on_a_node_like_process(train: TrainConfig, root: Path, run_dir: str | None = None) -> str:
    """``python -m tgnb.train RUN_FILE --check`` in `root` with it on ``PYTHONPATH``, as the node
    will run it (given a run file: the light checks `check` made are not made again); its
    one-line refusal becomes a `ValidationError`; its output (the resolved config as YAML) is
    returned."""
    import time

    from tgnb.backends.local import proctree
    from tgnb.runs import node
    from tgnb.runs.runfile import RunFile

    with tempfile.TemporaryDirectory(prefix="tgnb-check-") as tmp:
        config = Path(tmp) / node.RUN_FILE
        run = RunFile(RunSpec("check", train), time.time())  # the run's name is train's
        config.write_text(run.to_json(), encoding="utf-8")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
        env.setdefault("HF_HUB_OFFLINE", "1")
        tag = f"check-{os.getpid()}-{Path(tmp).name}"
        env[proctree.TAG_ENV] = proctree.tag(tag, 0)  # inherited by whatever the check starts
        cmd = [sys.executable, "-m", "tgnb.train", str(config), "--check"]
        cmd += ["--run-dir", run_dir or str(Path(tmp) / "run")]
        # Output to files, not pipes: a process the user's modules start at import keeps a pipe
        # open, and reading to its end would wait for that process, not for the check.
        with open(Path(tmp) / "out", "w+") as out, open(Path(tmp) / "err", "w+") as err:
            proc = subprocess.Popen(
                cmd, cwd=root, env=env, stdout=out, stderr=err, start_new_session=True
            )
            try:
                code = proc.wait(CHECK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None
            finally:  # the check's whole tree: the check, and what it started, is ended
                proctree.kill_run(tag, [proc.pid])
                proc.wait()
            if code is None:
                raise ValidationError(
                    f"checking the config took over {CHECK_TIMEOUT_S:.0f} s (importing your "
                    "reward modules?): make their import quick"
                )
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
    if code == 0:
        return stdout
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit {code}"
    raise TrainConfigError(last.removeprefix("tgnb train: "))


def observed_preemption_rate(
    train: TrainConfig, state: ClusterState, nodes: int, now: datetime | None = None
) -> tuple[TrainConfig, str | None]:
    """With ``checkpoint.auto``, the launch's estimate of the run's preemption rate from what
    the cluster observed, its ``preemptions_per_hour`` setting the prior: `train` weighing it
    (`tgnb.cloud.rates.apply`: ``checkpoint.observed_preemptions_per_hour``,
    ``preemptions_source`` and the estimate's weight and time, which a restart updates) and the
    line that says where it came from; `train` and None when ``auto`` is off."""
    from tgnb.cloud.rates import apply

    return apply(train, state, nodes, now)
