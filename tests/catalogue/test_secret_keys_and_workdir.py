"""The fault catalogue's table for secrets and the user's folder (issue 34: items 1, 2, 3, 4, 18).

- A training config key that names a secret (``trl.hub_token``, ``*_key``, ``*password*``) is
  refused by its name, whatever its value, as an env variable is (`tgnb.config.secret_keys`); a
  tokenizer's ``pad_token`` is no secret.
- The workdir snapshot leaves credential files out (`tgnb.runs.workdir.CREDENTIALS`), says so at
  launch, ships one the ignore file negates (``!.env``), and refuses a file holding a registered
  secret, naming the file and not the secret.
- A Slurm job sees only what the run declares: the kernel's ``TOGETHER_API_KEY``, ``HF_TOKEN`` and
  ``WANDB_API_KEY`` never reach it (`tgnb.backends.slurm.commands.clean_environ`).
- A failed run's last error line is masked wherever it is shown: ``status.detail``, ``error()``,
  the sidebar's JSON, the RunPanel's HTML and text (`tgnb.markup.plain` masks).
- A placeholder secret (``HF_TOKEN=none``) masks no ordinary word (`tgnb.config.counts_as_secret`).

Through a real emulator daemon and `Session.launch` (local backend), the real Slurm (``sinfo``), the
real script renderer and Kubernetes objects. The Slurm job's program is a few lines of bash that
write the environment it sees (the training runtime is not what is tested there).
"""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tgnb.backends.base import JobState, Resources, RunSpec, SecretRef
from tgnb.backends.kubernetes.objects import build_objects
from tgnb.backends.slurm.render import render_script
from tgnb.config import Scrubber, scrub
from tgnb.emulator.testing import running_emulator
from tgnb.errors import ValidationError
from tgnb.runs import workdir as wd
from tgnb.runs.run import Run
from tgnb.runs.store import RunStore
from tgnb.session import Session, attach

from .conftest import FAKE_KEY, record
from .test_env_secrets import refused

#: a value no-one registered and sharing no 8 characters with `FAKE_KEY`: refused by its key's name
PLAIN = "wandb-plain-Zq9XvT4kLm2PwR7sYb3NcH8d"

# -- 1. secrets by key name in the training config ------------------------------------------------
CONFIG_BY_NAME: dict[str, dict[str, Any]] = {
    "trl.hub_token": {"trl": {"hub_token": PLAIN}},
    "push_to_hub_token": {"trl": {"push_to_hub_token": PLAIN}},
    "wandb_api_key": {"trl": {"wandb_api_key": PLAIN}},
    "s3.secret_key": {"trl": {"s3": {"secret_key": PLAIN}}},
    "db.password": {"lora": {"db": {"password": PLAIN}}},
    "aws_access_key_id-nested-list": {"trl": {"callbacks": [{"aws_access_key": PLAIN}]}},
    "upper-HF_TOKEN": {"trl": {"HF_TOKEN": PLAIN}},
}
CONFIG_OK = {
    "algorithm": "dpo",
    "trl": {
        "report_to": "none",
        "hub_token": None,
        "max_tokens": 5,
        "tokenizer": {"pad_token": "<|pad|>", "eos_token": "</s>", "bos_token": "<s>"},
        "pad_token_id": 0,
    },
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    home = tmp_path_factory.mktemp("secrets-round3")
    with running_emulator(home, time_scale=0.01):
        yield attach(local=True, home=home)


@pytest.mark.parametrize("train", CONFIG_BY_NAME.values(), ids=list(CONFIG_BY_NAME))
def test_a_config_key_naming_a_secret_is_refused_on_every_engine(train: dict[str, Any]) -> None:
    def spec() -> RunSpec:  # built inside the call: a RunSpec may check itself when built
        return RunSpec(name="run", train={"algorithm": "dpo", **train}, image="img:1")

    exc = refused(lambda: render_script(spec(), "/shared/runs/run"), PLAIN)
    assert "secrets={" in str(exc)
    refused(lambda: build_objects(spec(), "research"), PLAIN)


def test_a_hub_token_is_refused_at_launch_and_nothing_stored(session: Session) -> None:
    before = [r.name for r in session.store.list()]
    launch = lambda: session.launch(  # noqa: E731
        "dpo", name="hubtok", preemptible=False, trl={"hub_token": PLAIN}
    )
    assert "trl.hub_token" in str(refused(launch, PLAIN))
    assert [r.name for r in session.store.list()] == before
    data = b"".join(p.read_bytes() for p in session.store.home.glob("runs.sqlite*"))
    assert PLAIN.encode() not in data


def test_special_tokens_and_empty_secret_keys_pass() -> None:
    spec = RunSpec(name="run", train=CONFIG_OK, image="img:1")
    ok = "#SBATCH" in render_script(spec, "/shared/runs/run")
    ok = ok and build_objects(spec, "research").job is not None
    record(ok)
    assert ok


# -- 18. a floor on what counts as a secret value --------------------------------------------------
PLACEHOLDERS = ["none", "null", "changeme", "********", "placeholder", "dummy"]


@pytest.mark.parametrize("value", PLACEHOLDERS)
def test_a_placeholder_secret_masks_no_ordinary_word(value: str) -> None:
    s = Scrubber()
    s.register(value)
    text = (
        "report_to: none; nonexistent.yaml; nullable; changeme later; a placeholder; "
        "dummy_data; ********** stars"
    )
    ok = s.scrub(text) == text and not s.holds(text)
    record(ok)
    assert ok, s.scrub(text)


def test_hf_token_none_does_not_refuse_report_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "none")
    ok = "report_to: none" in scrub("report_to: none")
    try:
        spec = RunSpec(name="run", train={"algorithm": "dpo", "trl": {"report_to": "none"}})
        render_script(spec, "/shared/runs/run")
    except ValidationError:
        ok = False
    record(ok)
    assert ok


# -- 2. credential files and the workdir snapshot --------------------------------------------------
CREDENTIAL_FILES = [
    ".env",
    "sub/.env.local",
    ".netrc",
    ".ssh/id_ed25519",
    ".ssh/config",
    "certs/server.pem",
    "tls/client.key",
    ".aws/credentials",
    ".config/gcloud/application_default_credentials.json",
    "keys/service-account-prod.json",
    ".git-credentials",
    ".kube/config",
    ".docker/config.json",
    "id_rsa",
]


def _folder(root: Path, extra: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("print('trained')\n")
    (root / "README.md").write_text("notes\n")
    for rel in extra:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("password=hunter2-not-registered\n")
    return root


@pytest.mark.parametrize("rel", CREDENTIAL_FILES)
def test_a_credential_file_is_left_out_and_said(tmp_path: Path, rel: str) -> None:
    snap = wd.scan(_folder(tmp_path / "w", [rel]))
    top = rel.split("/", 1)[0]
    said = any(rel == x or rel.startswith(x) or x.rstrip("/") == top for x in snap.left_out)
    ok = rel not in snap.files and said and "left credential files out" in snap.notice()
    record(ok)
    assert ok, (snap.files, snap.left_out)
    assert set(snap.files) == {"train.py", "README.md"}


def test_a_negation_in_the_ignore_file_ships_one(tmp_path: Path) -> None:
    root = _folder(tmp_path / "w", [".env", ".netrc"])
    (root / wd.IGNORE_FILE).write_text("# ship the .env, on purpose\n!.env\n")
    snap = wd.scan(root)
    ok = ".env" in snap.files and ".netrc" not in snap.files and snap.left_out == (".netrc",)
    record(ok)
    assert ok, (snap.files, snap.left_out)


@pytest.mark.parametrize("where", ["config.py", "data/notes.txt", "nested/deep/settings.yaml"])
def test_a_shipped_file_holding_a_registered_secret_is_refused(tmp_path: Path, where: str) -> None:
    root = _folder(tmp_path / "w", [])
    (root / where).parent.mkdir(parents=True, exist_ok=True)
    (root / where).write_text(f"API = 'x'\nKEY = {FAKE_KEY!r}\n")
    exc = refused(lambda: wd.scan(root))
    assert where in str(exc)


def test_launch_says_what_it_left_out_and_the_run_directory_lacks_it(
    session: Session, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _folder(tmp_path / "w", [".env", ".ssh/id_rsa"])
    run = session.launch("train.py", workdir=root, name="left-out", preemptible=False)
    said = capsys.readouterr().out
    st = run.wait(timeout=180, progress=False)
    assert run.run_dir is not None
    copy = run.run_dir / "workdir"
    shipped = {p.relative_to(copy).as_posix() for p in copy.rglob("*")}
    ok = ".env" not in shipped and ".ssh" not in shipped and ".env" in said and ".ssh/" in said
    record(ok)
    assert ok, (shipped, said)
    assert st.state is JobState.SUCCEEDED, (st, run.logs()[-5:])


# -- 3. a Slurm job gets only what the run declares ------------------------------------------------
def _slurm_answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=15, check=False)
    return out.returncode == 0 and bool(out.stdout.strip())


@pytest.mark.slurm
def test_a_slurm_job_gets_no_key_of_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.backends.slurm import SlurmBackend

    if not _slurm_answers():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("Slurm is needed under CI")
        pytest.skip("no Slurm here")
    program = tmp_path / "dump_env.sh"  # stands in for python -m tgnb.train: writes its env
    program.write_text('#!/bin/bash\n[ "$2" = tgnb.train ] || exec python "$@"\nenv > "$5/env"\n')
    program.chmod(0o755)
    hf = "hf_" + pysecrets.token_hex(16)
    monkeypatch.setenv("TOGETHER_API_KEY", FAKE_KEY)
    monkeypatch.setenv("HF_TOKEN", hf)
    monkeypatch.setenv("WANDB_API_KEY", PLAIN)
    monkeypatch.setenv("DECLARED_SRC", "declared-secret-value-42")
    backend = SlurmBackend(runs_root=tmp_path / "runs", gres=False, python=str(program))
    spec = RunSpec(
        name="clean-env",
        train={"algorithm": "dpo"},
        resources=Resources(nodes=1, gpus_per_node=0, preemptible=False),
        env={"DECLARED_PLAIN": "1"},
        secrets={"DECLARED_TOKEN": SecretRef(name="d", env="DECLARED_SRC")},
    )
    job = backend.submit(spec)
    try:
        finished = lambda: backend.status(job).state.finished  # noqa: E731
        wait_until(finished, 120, what="the job to finish", every=0.5)
    finally:
        subprocess.run(["scancel", job], check=False, timeout=30)
    seen = dict(
        line.split("=", 1)
        for line in (tmp_path / "runs" / "clean-env" / "env").read_text().splitlines()
        if "=" in line
    )
    leaked = {"TOGETHER_API_KEY", "HF_TOKEN", "WANDB_API_KEY"} & set(seen)
    ok = (
        seen.get("DECLARED_PLAIN") == "1"
        and seen.get("DECLARED_TOKEN") == "declared-secret-value-42"
    )
    record(ok and not leaked, secret=bool(leaked))
    assert not leaked, sorted(leaked)
    assert ok, sorted(seen)


# -- 4. a failed run's error line, masked wherever it is shown -------------------------------------
def _failed_run(tmp_path: Path) -> Run:
    """A failed run as a fresh kernel reads it: the store's record and its run directory."""
    store = RunStore(tmp_path / "home")
    spec = RunSpec(name="failed", train={"algorithm": "script", "max_steps": 4})
    run_dir = tmp_path / "runs" / "failed"
    run_dir.mkdir(parents=True)
    rec = store.create(spec, backend="local", cluster_id="c", run_dir=run_dir)
    store.set_state(rec.id, JobState.FAILED, f"exit 1: token {FAKE_KEY} refused", exit_code=1)
    (run_dir / "train.log").write_text(
        "Traceback (most recent call last):\n  File 'train.py', line 3\n"
        f"RuntimeError: 401 Unauthorized for Bearer {FAKE_KEY}\n"
    )
    return Run(store.get(rec.id), store)


def test_a_failed_runs_error_line_is_masked_everywhere(tmp_path: Path) -> None:
    from tgnb.notebook.widgets import RunPanel
    from tgnb.server.serialize import run_json

    run = _failed_run(tmp_path)
    panel = RunPanel(run, start=False)
    panel.refresh()
    shown = {
        "status.detail": run.status.detail,
        "error()": str(run.error()),
        "report().detail": run.report().detail,
        "sidebar JSON": json.dumps(run_json(run, detail=True)),
        "RunPanel": panel.progress_label.value + panel.header.value + panel.error.value,
    }
    leaked = [where for where, text in shown.items() if FAKE_KEY[-20:] in text]
    record(not leaked, secret=bool(leaked))
    assert not leaked, shown
    assert "401 Unauthorized" in shown["status.detail"] and "***" in shown["status.detail"]
