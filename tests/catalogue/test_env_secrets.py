"""The fault catalogue's table for secrets and hostile values in a run's ``env``, on every engine.

One rule for every engine (`tgnb.runs.spec.check_no_secrets`, run by `RunSpec.validate`): a variable
whose name looks like a secret's, a value holding a registered secret, a 12-character prefix of
one or any 8 characters of its random part (`tgnb.config.random_part`: the key less its public
words, here ``1234567890abc...xyz`` of `FAKE_KEY`), and a value holding a control character are
refused with the fix (``secrets={...}``) before anything is written -- no ``job.sbatch``, no
Kubernetes object, no row in ``runs.sqlite`` (which is the owner's only, 0600). Through a real emulator daemon and `Session.launch` for the local backend,
the real Slurm script renderer and the real Kubernetes objects. The kubelet's ``$(VAR)`` expansion
cannot run here: `kubelet_expand` follows its documented rules (``$(NAME)`` replaced when NAME is
defined, ``$$`` reduced to ``$``) to show what a pod would receive.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.kubernetes.objects import build_objects
from tgnb.backends.slurm.render import render_script
from tgnb.config import PIECE_CHARS, scrub
from tgnb.emulator.testing import running_emulator
from tgnb.errors import TgnbError, ValidationError
from tgnb.session import Session, attach

from .conftest import FAKE_KEY, record

PLAIN = "wandb-plain-0123456789abcdef0123456789"  # a value no-one registered: refused by name
BAD_ENV: dict[str, dict[str, str]] = {
    "WANDB_API_KEY": {"WANDB_API_KEY": PLAIN},
    "HF_TOKEN": {"HF_TOKEN": PLAIN},
    "GITHUB_TOKEN_RW": {"GITHUB_TOKEN_RW": PLAIN},
    "DB_PASSWORD": {"DB_PASSWORD": PLAIN},
    "AWS_SECRET_ACCESS_KEY": {"AWS_SECRET_ACCESS_KEY": PLAIN},
    "openai_api_key-lowercase": {"openai_api_key": PLAIN},
    # the three below lie in FAKE_KEY's random part: caught by its 8-character pieces
    "key-suffix-20": {"OPTS": FAKE_KEY[-20:]},
    "key-middle-10": {"OPTS": "x" + FAKE_KEY[20:30] + "y"},
    "key-piece-8": {"OPTS": FAKE_KEY[30 : 30 + PIECE_CHARS]},
    "value-nul": {"OPTS": "a\x00b"},
    "value-newline": {"OPTS": "a\nexport X=1"},
    "value-escape": {"OPTS": "a\x1b[2Jb"},
    "value-del": {"OPTS": "a\x7fb"},
    "value-c1": {"OPTS": "a\x85b"},
}
OK_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def refused(call: Callable[[], Any], *values: str) -> TgnbError:
    """`call` must raise a one-line `ValidationError` naming the fix and showing no secret."""
    try:
        call()
    except ValidationError as exc:
        text = str(exc) + "".join(traceback.format_exception(exc))
        leaked = any(v in text for v in (FAKE_KEY, PLAIN, *values) if len(v) >= PIECE_CHARS)
        one_line = "\n" not in str(exc) and len(str(exc)) < 400
        record(one_line, secret=leaked)
        assert not leaked, text
        assert one_line, str(exc)
        return exc
    record(False)
    raise AssertionError("accepted")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    home = tmp_path_factory.mktemp("env-secrets")
    with running_emulator(home, time_scale=0.01):
        yield attach(local=True, home=home)


def _store_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in home.glob("runs.sqlite*"))


@pytest.mark.parametrize("env", BAD_ENV.values(), ids=list(BAD_ENV))
def test_local_launch_refused_and_nothing_stored(session: Session, env: dict[str, str]) -> None:
    before = [r.name for r in session.store.list()]
    exc = refused(lambda: session.launch("dpo", name="envcase", env=env), *env.values())
    if "control character" not in str(exc):
        assert "secrets={" in str(exc)
    assert [r.name for r in session.store.list()] == before
    data = _store_bytes(session.store.home)
    assert all(v.encode() not in data for v in env.values())


@pytest.mark.parametrize("env", BAD_ENV.values(), ids=list(BAD_ENV))
def test_slurm_script_refused(env: dict[str, str]) -> None:
    """Refused by the spec as it is built, before anything renders."""
    refused(
        lambda: render_script(RunSpec(name="run", train={"algorithm": "dpo"}, env=env), "/r/run"),
        *env.values(),
    )


@pytest.mark.parametrize("env", BAD_ENV.values(), ids=list(BAD_ENV))
def test_kubernetes_objects_refused(env: dict[str, str]) -> None:
    """Refused by the spec as it is built, before any object is."""
    train = {"algorithm": "dpo"}
    refused(
        lambda: build_objects(RunSpec(name="run", train=train, image="img:1", env=env), "ns"),
        *env.values(),
    )


def test_plain_variables_pass_on_every_engine() -> None:
    spec = RunSpec(name="run", train={"algorithm": "dpo"}, image="img:1", env=OK_ENV)
    assert "TOKENIZERS_PARALLELISM=false" in render_script(spec, "/shared/runs/run")
    env = {
        e.name: e.value
        for e in build_objects(spec, "research").job.spec.template.spec.containers[0].env
    }
    assert env["TOKENIZERS_PARALLELISM"] == "false"


@pytest.mark.parametrize("start", [0, 9, 20, len(FAKE_KEY) - 20, len(FAKE_KEY) - PIECE_CHARS])
def test_any_piece_of_a_registered_key_is_scrubbed(start: int) -> None:
    """Start 0 (``tgp_FAKE_SEC``, public words only) is caught by the prefix rule; start 9 by the
    pieces of its random part (``SECRET_`` may stay); the others lie in the random part."""
    piece = FAKE_KEY[start : start + max(PIECE_CHARS, 20 if start else 12)]
    text = scrub(f"error: the header was 'Bearer {piece}' (cut)")
    leaked = piece in text
    record(not leaked, secret=leaked)
    assert not leaked and "***" in text, text


def test_the_run_store_is_the_owners_only(session: Session) -> None:
    mode = os.stat(session.store.path).st_mode & 0o777
    record(mode == 0o600)
    assert mode == 0o600, oct(mode)


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' documented expansion of a container's command, args and env values:
    ``$(NAME)`` becomes NAME's value when it is defined (else stays), ``$$`` becomes ``$``."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            if text[i + 1] == "$":
                out.append("$")
                i += 2
                continue
            end = text.find(")", i + 2)
            if text[i + 1] == "(" and end > 0:
                name = text[i + 2 : end]
                out.append(env.get(name, text[i : end + 1]))
                i = end + 1
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


RUN_DIRS = ["/data/runs/$(HF_TOKEN)", "/data/runs/$$(HF_TOKEN)", "/data/runs/a$b", "/data/runs/$"]


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_kubernetes_passes_run_dir_and_env_values_literally(run_dir: str) -> None:
    """A pod's argv and environment hold exactly what was asked: no secret expanded into them."""
    spec = RunSpec(
        name="run",
        train={"algorithm": "dpo"},
        image="img:1",
        run_dir=run_dir,
        env={"EXTRA_ARGS": f"--x {run_dir}"},
        resources=Resources(nodes=2, gpus_per_node=1),
    )
    container = build_objects(spec, "research").job.spec.template.spec.containers[0]
    pod_env = {"HF_TOKEN": "hf_live_secret", "JOB_COMPLETION_INDEX": "1"}
    argv = [kubelet_expand(a, pod_env) for a in container.command + (container.args or [])]
    values = {e.name: kubelet_expand(e.value, pod_env) for e in container.env if e.value}
    ok = run_dir in argv and values["EXTRA_ARGS"] == f"--x {run_dir}" and "--node_rank=1" in argv
    record(ok, secret="hf_live_secret" in " ".join([*argv, *values.values()]))
    assert ok, (argv, values)
