"""The Python API and the launch path under hostile input: `tgnb.cloud` and `Session` against a
real emulator daemon, `RunSpec`/`Resources` and the Slurm script renderer, and the secret paths
(errors from a real HTTP server that echoes the Authorization header). Every case raises a typed
`tgnb.errors` exception with a one-line message holding no secret, and records nothing."""

from __future__ import annotations

import http.server
import json
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.backends.base import Resources, RunSpec, SecretRef
from tgnb.backends.slurm.render import render_script
from tgnb.emulator.testing import running_emulator
from tgnb.errors import TgnbError
from tgnb.session import Session, attach

from .conftest import FAKE_KEY, record

BAD_TEXT = {"newline": "x\n", "nul": "x\x00", "u2028": "x\u2028", "subst": "$(id)"}


def refused(call: Callable[[], Any], *secrets: str) -> TgnbError:
    """Run `call`; it must raise a `TgnbError` whose text and traceback show no secret."""
    try:
        call()
    except TgnbError as exc:
        text = str(exc) + "".join(traceback.format_exception(exc))
        leaked = any(s and (s in text or s[:12] in text) for s in (FAKE_KEY, *secrets))
        one_line = "\n" not in str(exc) and len(str(exc)) < 1000
        record(one_line, secret=leaked)
        assert not leaked, text
        assert one_line, str(exc)
        return exc
    except Exception as exc:
        record(False, server_error=True)
        raise AssertionError(f"untyped {type(exc).__name__}: {exc}"[:300]) from None
    record(False)
    raise AssertionError("accepted")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    home = tmp_path_factory.mktemp("api")
    with running_emulator(home, time_scale=0.01):
        yield attach(local=True, home=home)


BAD_SCALE = [2**63, 8 * 2**60, 80_000, "16", 12, -8, True, 8.5, None, [16]]


@pytest.mark.parametrize("value", BAD_SCALE, ids=[repr(v)[:20] for v in BAD_SCALE])
def test_scale_refused(session: Session, value: Any) -> None:
    before = session.status().desired_preemptible_gpus
    refused(lambda: session.cluster.scale(value))
    assert session.status().desired_preemptible_gpus == before


BAD_ATTACH = ["x" * 100_000, "", "   ", 5, "a\x00b", ["x"]]


@pytest.mark.parametrize("value", BAD_ATTACH, ids=[repr(v)[:20] for v in BAD_ATTACH])
def test_attach_refused(session: Session, value: Any) -> None:
    refused(lambda: session.cloud.attach(value))


def _yaml_file(tmp: Path, text: str) -> str:
    path = tmp / "cfg.yaml"
    path.write_text(text)
    return str(path)


BAD_LAUNCH: dict[str, dict[str, Any]] = {
    **{f"name-{k}": {"name": "nl" + v} for k, v in BAD_TEXT.items()},
    "name-upper": {"name": "ABC"},
    "name-long": {"name": "x" * 60},
    "name-int": {"name": 5},
    "steps-negative": {"max_steps": -5},
    "steps-1e23-int": {"max_steps": 10**23},
    "steps-1e23-float": {"max_steps": 1e23},
    "steps-string": {"max_steps": "5"},
    "seed-negative": {"seed": -1},
    "reward-os-system": {"rewards": ["os:system"]},
    "reward-unknown": {"rewards": ["nope"]},
    "reward-not-a-path": {"rewards": ["a b:c"]},
    "reward-nested-list": {"rewards": [["x"]]},
    "model-subst": {"model": "$(touch /tmp/tgnb-pwned)"},
    "model-newline": {"model": "a\nb"},
    "model-int": {"model": 5},
    "dataset-unknown": {"dataset": "nope"},
    "algorithm-ppo": {"algorithm": "ppo"},
    "unknown-key": {"evil": 1},
    "trl-steps": {"trl": {"max_steps": 5}},
    "checkpoint-every-negative": {"checkpoint": {"every_steps": -1}},
    "checkpoint-keep-zero": {"checkpoint": {"keep_last": 0}},
    "checkpoint-auto-string": {"checkpoint": {"auto": "maybe"}},
    "checkpoint-failures-zero": {"checkpoint": {"auto": True, "failures_per_hour": 0}},
    "checkpoint-poll-string": {"checkpoint": {"drain_poll_seconds": "abc"}},
    "checkpoint-seconds-nan": {"checkpoint": {"every_seconds": float("nan")}},
    "env-secret-value": {"env": {"MY_VAR": FAKE_KEY}},
    "env-secret-prefix": {"env": {"MY_VAR": FAKE_KEY[:20]}},
    "env-bad-name": {"env": {"BAD NAME": "x"}},
    "env-value-int": {"env": {"A": 5}},
    "config-hub-token": {"trl": {"hub_token": FAKE_KEY}},
    "nodes-0": {"nodes": 0},
    "nodes-string": {"nodes": "1"},
    "nodes-huge": {"nodes": 10**9},
    "gpus-per-node-string": {"gpus_per_node": "8\n"},
    "min-nodes-above": {"min_nodes": 5},
    "time-limit-newline": {"time_limit": "01:00:00\n"},
    # issue 24, item 24: checks that were left to the node, now made at launch
    "lr-negative": {"trl": {"learning_rate": -1}},
    "lr-1e308": {"trl": {"learning_rate": 1e308}},
    "trl-typo": {"trl": {"learning_rte": 0.1}},
    "num-generations-1": {"trl": {"num_generations": 1}},
    "dataset-relative-missing": {"dataset": "data/missing.jsonl"},
    "env-reserved": {"env": {"TGNB_RUN_DIR": "/elsewhere"}},
    "script-args-without-script": {"args": ["--lr", "1"]},
}


@pytest.mark.parametrize("kw", BAD_LAUNCH.values(), ids=list(BAD_LAUNCH))
def test_launch_refused_and_nothing_recorded(session: Session, kw: dict[str, Any]) -> None:
    before = [r.name for r in session.store.list()]
    runs_dir = session.store.home / "runs"
    listing = sorted(p.name for p in runs_dir.iterdir()) if runs_dir.exists() else []
    refused(lambda: session.launch("grpo", **kw))
    assert [r.name for r in session.store.list()] == before
    if runs_dir.exists():
        assert sorted(p.name for p in runs_dir.iterdir()) == listing


@pytest.mark.parametrize(
    "text",
    [
        "algorithm: !!python/object/apply:os.system ['id']\n",
        "!!python/name:os.system\n",
        "a: [unclosed\n",
        "- a list\n",
    ],
    ids=["python-apply", "python-name", "broken", "list"],
)
def test_launch_yaml_file_refused(session: Session, tmp_path: Path, text: str) -> None:
    exc = refused(lambda: session.launch(_yaml_file(tmp_path, text)))
    assert "ConstructorError" not in type(exc).__name__


def _spec(**kw: Any) -> RunSpec:
    res = kw.pop("resources", {})
    return RunSpec(
        name=kw.pop("name", "run"), train={"algorithm": "grpo"}, resources=Resources(**res), **kw
    )


BAD_SPECS: dict[str, dict[str, Any]] = {
    **{f"name-{k}": {"name": "run" + v} for k, v in BAD_TEXT.items()},
    "cpus-injection": {"resources": {"cpus_per_task": "4\n#SBATCH --wrap=$(id)"}},
    "cpus-float": {"resources": {"cpus_per_task": 4.5}},
    "cpus-bool": {"resources": {"cpus_per_task": True}},
    "memory-injection": {"resources": {"memory_gib": "1\nsource Secrets"}},
    "memory-negative": {"resources": {"memory_gib": -1}},
    "nodes-string": {"resources": {"nodes": "2"}},
    "gpus-huge": {"resources": {"gpus_per_node": 10**6}},
    "preemptible-string": {"resources": {"preemptible": "no"}},
    **{f"partition-{k}": {"partition": "p" + v} for k, v in BAD_TEXT.items()},
    **{f"account-{k}": {"account": "a" + v} for k, v in BAD_TEXT.items()},
    **{f"time-{k}": {"time_limit": "01:00:00" + v} for k, v in BAD_TEXT.items()},
    **{f"env-name-{k}": {"env": {"A" + v: "x"}} for k, v in BAD_TEXT.items()},
    **{
        f"secret-name-{k}": {"secrets": {"S" + v: SecretRef(name="s")}} for k, v in BAD_TEXT.items()
    },
    **{
        f"secret-source-{k}": {"secrets": {"S": SecretRef(name="s", env="X" + v)}}
        for k, v in BAD_TEXT.items()
    },
    "env-secret-value": {"env": {"MY_VAR": FAKE_KEY}},
    "config-secret": {"train": {"trl": {"hub_token": FAKE_KEY}}},
}


@pytest.mark.parametrize("kw", BAD_SPECS.values(), ids=list(BAD_SPECS))
def test_slurm_script_refused(kw: dict[str, Any]) -> None:
    """Refused by the spec as it is built (the contract checks itself), before any rendering."""
    kw = dict(kw)
    train = kw.pop("train", None)

    def build() -> RunSpec:
        return RunSpec(name="run", train=train) if train is not None else _spec(**kw)

    refused(lambda: render_script(build(), "/shared/runs/run"))


@pytest.mark.parametrize("run_dir", ["/x\ny", "/x\x00y", "relative", "/x y"])
def test_slurm_run_dir_refused(run_dir: str) -> None:
    refused(lambda: render_script(_spec(), run_dir))


class _Echo(http.server.BaseHTTPRequestHandler):
    """A real HTTP server that answers 400 quoting the Authorization header back (a hostile or
    careless proxy): the key must not come back through tgnb's errors or their chains."""

    def _answer(self) -> None:
        auth = self.headers.get("Authorization", "")
        body = json.dumps({"message": "x" * 150 + f" you sent {auth}", "code": 3}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.parametrize("call", ["attach", "clusters", "create", "delete"])
def test_errors_from_an_echoing_server_hold_no_key(echo: str, call: str) -> None:
    """Defects 14 and 15: no chained SDK exception, masked before cut (no prefix of the key)."""
    from tgnb.cloud import Cloud

    key = "tgp_ECHO_SECRET_" + "k" * 40
    cloud = Cloud(api_key=key, base_url=echo, project_id="p", max_retries=0)
    calls: dict[str, Callable[[], Any]] = {
        "attach": lambda: cloud.attach("x"),
        "clusters": cloud.clusters,
        "create": lambda: cloud.create("c"),
        "delete": lambda: cloud.delete("c-1"),
    }
    exc = refused(calls[call], key)
    assert exc.__cause__ is None and exc.__suppress_context__
