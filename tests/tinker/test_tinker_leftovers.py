"""No Post-Training resource bills unseen (issue 45, point 4): a Tinker script, written as
Tinker's docs write it and run from a folder of its own against the real emulator daemon over
loopback HTTP, is stopped by SIGTERM, SIGINT or SIGKILL while its resource provisions, while it
trains and while it samples. SIGTERM and SIGINT stop what it held; after SIGKILL the registry of
the tgnb home has the resource, the next script names it with what it has cost (the emulator's
bill, not this process's first look), ``tgnb pt stop --leftovers`` stops it, and with a short
inactivity timeout it stops itself. The exit report's dollars agree with the emulator's bill.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle, running_emulator

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")

ACTIVE = ("PENDING", "CREATING", "READY")

#: A Tinker script as its docs write it, but for the one import; it says which phase it is in.
SCRIPT = """\
import sys
import tgnb.tinker as tinker
from tinker import types

phase = sys.argv[1]
service_client = tinker.ServiceClient()
training_client = service_client.create_lora_training_client(base_model="tgnb/tiny-llama", rank=4)
datum = types.Datum(
    model_input=types.ModelInput.from_ints([1, 5, 6, 7]),
    loss_fn_inputs={"target_tokens": [5, 6, 7, 8], "weights": [1.0] * 4},
)
sampler = None
if phase == "sampling":
    sampler = training_client.save_weights_and_get_sampling_client(name="s")
print("PHASE", phase, flush=True)
while True:
    if sampler is None:
        training_client.forward_backward([datum], "cross_entropy").result()
        training_client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    else:
        sampler.sample(
            prompt=types.ModelInput.from_ints([1, 5]),
            num_samples=2,
            sampling_params=types.SamplingParams(max_tokens=8),
        ).result()
"""

NEXT = "import tgnb.tinker as tinker\ntinker.ServiceClient()\n"


@pytest.fixture(scope="module")
def slow_provisioning(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorHandle]:
    """An emulator whose resources take 3 s to provision (300 platform seconds at 0.01): long
    enough to be interrupted while provisioning, short enough for a test."""
    home = tmp_path_factory.mktemp("leftovers-home")
    with running_emulator(home, time_scale=0.01, provision_delay_s=300) as emu:
        yield emu


def env_of(emu: EmulatorHandle, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOGETHER_", "TGNB_"))}
    env.update(emu.env, HF_HUB_OFFLINE="1", TOGETHER_DISABLE_VERSION_CHECK="1", **extra)
    return env


def entries(emu: EmulatorHandle) -> list[dict[str, Any]]:
    folder = emu.home / "posttraining" / "resources"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def resources(emu: EmulatorHandle) -> dict[str, str]:
    with emu.client() as client:
        page = client.post_training.model_resources.list(limit=100)
    return {r.id: r.status.removeprefix("MODEL_RESOURCES_STATUS_") for r in page.data}


def active(emu: EmulatorHandle) -> set[str]:
    return {rid for rid, status in resources(emu).items() if status in ACTIVE}


def _as_from_a_terminal() -> None:
    """SIGINT back to its default in the script, as a shell's foreground job has it: a shell that
    starts a background job without job control (``cmd &`` in a script, as CI may run the suite)
    leaves SIGINT ignored in everything below it, and an ignored SIGINT rightly stays ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_script(folder: Path, env: dict[str, str], phase: str) -> subprocess.Popen[str]:
    folder.mkdir(exist_ok=True)
    (folder / "train.py").write_text(SCRIPT, encoding="utf-8")
    return subprocess.Popen(
        [sys.executable, "train.py", phase],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_from_a_terminal,
    )


def wait_for(proc: subprocess.Popen[str], marker: str, timeout: float = 120) -> None:
    """Read the script's stdout until a line holds `marker` (the SDK's and its own lines)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if marker in line:
            return
        assert time.monotonic() < deadline, f"no {marker!r} in {timeout} s"
    raise AssertionError(f"the script ended before {marker!r}: {proc.stderr.read()}")  # type: ignore[union-attr]


def interrupt(folder: Path, env: dict[str, str], phase: str, signum: int) -> str:
    """Run the script to `phase`, send `signum`, wait for its end: its stderr."""
    proc = start_script(folder, env, phase)
    try:
        marker = "waiting for READY" if phase == "provisioning" else f"PHASE {phase}"
        wait_for(proc, marker)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err


def wait_status(emu: EmulatorHandle, rid: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while resources(emu).get(rid) != wanted:
        assert time.monotonic() < deadline, f"{rid} is {resources(emu).get(rid)}, not {wanted}"
        time.sleep(0.2)


def next_script(folder: Path, env: dict[str, str]) -> str:
    (folder / "next.py").write_text(NEXT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "next.py"], cwd=folder, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def tgnb_pt(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tgnb.cli", "pt", *args], env=env, capture_output=True, text=True
    )


PHASES = ("provisioning", "training", "sampling")


@pytest.mark.parametrize("phase", PHASES)
def test_sigkill_leaves_it_named_priced_and_stoppable(
    slow_provisioning: EmulatorHandle, tmp_path: Path, phase: str
) -> None:
    emu = slow_provisioning
    env = env_of(emu)
    before = active(emu)
    interrupt(tmp_path / "project", env, phase, signal.SIGKILL)
    left = active(emu) - before
    assert left, "the killed script's resource is not running: nothing to test"
    recorded = {e["resource_id"] for e in entries(emu)}
    assert left <= recorded, (left, entries(emu))  # written before the create was sent
    assert all("api_key" not in json.dumps(e).lower() for e in entries(emu))
    assert all(emu.api_key not in json.dumps(e) for e in entries(emu))
    for rid in left:  # READY and billing a while, so its cost so far is more than nothing
        wait_status(emu, rid, "READY")
    time.sleep(1.0)

    said = next_script(tmp_path / "project", env)
    for rid in left:
        line = next(x for x in said.splitlines() if rid in x)
        assert "no longer running" in line
        amount = float(re.search(r"\$([0-9.]+) so far", line)[1])  # type: ignore[index]
        billed = emu.rl_usage(rid)["cost"]
        assert 0 < amount <= billed, (line, billed)  # the bill, not this process's first look
    assert "tgnb pt stop --leftovers" in said

    listed = tgnb_pt(env, "leftovers")
    assert listed.returncode == 0 and all(rid in listed.stdout for rid in left), listed
    stopped = tgnb_pt(env, "stop", "--leftovers")
    assert stopped.returncode == 0, stopped.stderr
    assert not (active(emu) & left)
    assert not [e for e in entries(emu) if e["resource_id"] in left]
    assert "no leftover" in tgnb_pt(env, "leftovers").stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("phase", PHASES)
def test_sigterm_and_sigint_stop_what_it_held(
    slow_provisioning: EmulatorHandle, tmp_path: Path, phase: str, signum: int
) -> None:
    emu = slow_provisioning
    env = env_of(emu)
    before = set(resources(emu))
    err = interrupt(tmp_path / "project", env, phase, signum)
    made = set(resources(emu)) - before
    assert made, err
    still = {rid for rid in made if resources(emu)[rid] in ACTIVE}
    assert not still, (still, err)  # stopped by the handler, not left for an hour
    assert not [e for e in entries(emu) if e["resource_id"] in made], entries(emu)
    assert "stopping this script's sessions and model resources" in err
    listed = tgnb_pt(env, "leftovers").stdout  # (this case's: one case's failure fails no other)
    assert not [rid for rid in made if rid in listed], listed


#: The script, ending after three rounds instead of looping until stopped.
ENDS = SCRIPT.replace("while True:", "for _ in range(3):")


@pytest.mark.parametrize("end", ["exit", "SIGTERM"])
def test_exit_report_is_the_emulators_bill(
    slow_provisioning: EmulatorHandle, tmp_path: Path, end: str
) -> None:
    """At the emulator's time scale the bill is in platform time: the report, at a normal exit
    or at SIGTERM, reads the bill (the old stopwatch said 1 % of it here)."""
    emu = slow_provisioning
    env = env_of(emu)
    before = set(resources(emu))
    folder = tmp_path / "project"
    if end == "exit":
        folder.mkdir()
        (folder / "train.py").write_text(ENDS, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, "train.py", "sampling"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        err = done.stderr
    else:
        err = interrupt(folder, env, "sampling", signal.SIGTERM)
    made = set(resources(emu)) - before
    said = float(re.search(r"about \$([0-9.,]+)", err)[1].replace(",", ""))  # type: ignore[index]
    billed = sum(emu.rl_usage(rid)["cost"] for rid in made)
    assert said == pytest.approx(billed, rel=0.02, abs=0.0001), err
    assert "created to stop themselves after 900 s without an operation" in err


def test_exit_report_from_the_services_timestamps(tmp_path: Path) -> None:
    """Where tgnb cannot read the bill (the endpoint is not the tgnb home's emulator: the
    service), the report of a script that ends normally counts between the service's own READY
    and stop times: within 2 % of the bill of an emulator in real time."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(ENDS, encoding="utf-8")
    with running_emulator(tmp_path / "emu", time_scale=1.0, provision_delay_s=1.0) as emu:
        env = env_of(emu, TGNB_HOME=str(tmp_path / "elsewhere"))
        done = subprocess.run(
            [sys.executable, "train.py", "sampling"],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        said = float(re.search(r"about \$([0-9.]+)", done.stderr)[1])  # type: ignore[index]
        billed = sum(emu.rl_usage(rid)["cost"] for rid in resources(emu))
        assert said == pytest.approx(billed, rel=0.02, abs=0.0001), done.stderr
        assert "the time the service had them READY" in done.stderr


@pytest.mark.slow
def test_a_killed_scripts_resource_stops_itself(tmp_path: Path) -> None:
    """The inactivity timeout tgnb sets (here the API's shortest, 300 s) stops a resource whose
    script was killed, and its bill stops there; the next script then names nothing. The
    emulator counts the user's idle time at ``rl_idle_scale`` 0.02 (300 s in 6), as
    ``test_the_idle_scale_shortens_only_the_wait`` pins: the real expiry, not a 5-minute wait."""
    with running_emulator(tmp_path / "emu", time_scale=0.01, rl_idle_scale=0.02) as emu:
        env = env_of(emu, TGNB_PT_INACTIVE_TIMEOUT="300")
        interrupt(tmp_path / "project", env, "training", signal.SIGKILL)
        (rid,) = active(emu)
        with emu.client() as client:
            assert client.post_training.model_resources.retrieve(rid).inactive_timeout == 300
        wait_status(emu, rid, "STOPPED", timeout=60)
        cost = emu.rl_usage(rid)["cost"]
        time.sleep(1.0)
        assert emu.rl_usage(rid)["cost"] == cost  # billing stopped with it
        assert rid not in next_script(tmp_path / "project", env)
        assert not [e for e in entries(emu) if e["resource_id"] == rid]


def test_a_create_sent_again_with_its_key_is_the_same_resource(
    slow_provisioning: EmulatorHandle,
) -> None:
    """The emulator honours a create's Idempotency-Key, as the platform does an operation's: a
    retry after a lost answer creates nothing; the key with another body is a 422."""
    import together

    body: dict[str, Any] = {
        "base_model": "tgnb/tiny-llama",
        "compute_config": {"num_generator_replicas": 0},
        "inactive_timeout": 300,
    }
    key = {"Idempotency-Key": "test-key-" + str(time.time())}
    with slow_provisioning.client(max_retries=0) as client:
        first = client.post_training.model_resources.create(**body, extra_headers=key)
        again = client.post_training.model_resources.create(**body, extra_headers=key)
        assert again.id == first.id
        with pytest.raises(together.UnprocessableEntityError, match="another body"):
            client.post_training.model_resources.create(
                **{**body, "inactive_timeout": 600}, extra_headers=key
            )
        other = client.post_training.model_resources.create(**body)
        assert other.id != first.id
        for rid in (first.id, other.id):
            client.post_training.model_resources.stop(rid, force=True)


class SwallowingProxy:
    """A loopback HTTP proxy to the emulator that forwards every request, but answers no create
    of a model resource (it holds that connection open): the create is applied, its answer lost,
    as when a process dies between sending and reading."""

    def __init__(self, target: str) -> None:
        import http.server
        import threading

        import httpx

        self.creates = threading.Event()
        self.release = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                skip = {"host", "content-length", "connection", "accept-encoding"}
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                answer = httpx.request(
                    self.command, target + self.path, headers=headers, content=body, timeout=60
                )
                if self.command == "POST" and self.path.rstrip("/") == "/v1/rl/model-resources":
                    proxy.creates.set()
                    proxy.release.wait(120)  # never answered while the test runs
                    return
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_PATCH = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_killed_before_the_creates_answer_it_is_recorded_and_found(
    slow_provisioning: EmulatorHandle, tmp_path: Path
) -> None:
    """The registry's entry is on disk before the create is sent: killed while the create's
    answer has not come (the resource exists, its id never reached the script), the entry is
    there without an id; the next process finds the resource by reading them back (created
    since, same model and generators, claimed by no other entry) and names it."""
    emu = slow_provisioning
    proxy = SwallowingProxy(emu.base_url)
    try:
        env = env_of(emu, TOGETHER_BASE_URL=proxy.url)
        before = set(resources(emu))
        proc = start_script(tmp_path / "project", env, "training")
        try:
            assert proxy.creates.wait(120), "the script sent no create"
            (entry,) = [e for e in entries(emu) if e["pid"] == proc.pid]
            assert entry["resource_id"] is None and entry["root"] == proxy.url
            proc.kill()
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        (rid,) = set(resources(emu)) - before  # applied, though its answer never came
        wait_status(emu, rid, "READY")
        said = next_script(tmp_path / "project", env)
        assert rid in said and "no longer running" in said, said
        assert [e["resource_id"] for e in entries(emu) if e["key"] == entry["key"]] == [rid]
        assert tgnb_pt(env, "stop", "--leftovers").returncode == 0
        assert resources(emu)[rid] == "STOPPED"
    finally:
        proxy.close()


def test_stdout_closed_while_provisioning(
    slow_provisioning: EmulatorHandle, tmp_path: Path
) -> None:
    """``python train.py | head -1``: stdout closes while the resource provisions; the script
    fails on its next line out (BrokenPipeError) and its resource is stopped, not orphaned."""
    emu = slow_provisioning
    env = env_of(emu)
    before = set(resources(emu))
    proc = start_script(tmp_path / "project", env, "training")
    try:
        wait_for(proc, "waiting for READY")
        assert proc.stdout is not None
        proc.stdout.close()  # as head does after its line
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    made = set(resources(emu)) - before
    assert made
    assert not {rid for rid in made if resources(emu)[rid] in ACTIVE}
    assert not [e for e in entries(emu) if e["resource_id"] in made]


FORKS = """\
import os, signal, time
import tgnb.tinker as tinker
from tinker import types

service_client = tinker.ServiceClient()
training_client = service_client.create_lora_training_client(base_model="tgnb/tiny-llama", rank=4)
datum = types.Datum(
    model_input=types.ModelInput.from_ints([1, 5, 6, 7]),
    loss_fn_inputs={"target_tokens": [5, 6, 7, 8], "weights": [1.0] * 4},
)
ready_r, ready_w = os.pipe()
child = os.fork()
if child == 0:  # as a DataLoader worker: it inherits the handlers, then is terminated
    os.write(ready_w, b"x")
    time.sleep(60)
    os._exit(0)
os.read(ready_r, 1)  # a signal in the instant after fork is dropped by CPython itself
time.sleep(0.2)
os.kill(child, signal.SIGTERM)
_, status = os.waitpid(child, 0)
print("CHILD", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, flush=True)
training_client.forward_backward([datum], "cross_entropy").result()
print("TRAINED", flush=True)
"""


def test_a_forked_childs_sigterm_leaves_the_parents_resources(
    slow_provisioning: EmulatorHandle, tmp_path: Path
) -> None:
    """A forked child (a DataLoader worker) inherits the handler; its SIGTERM ends it as SIGTERM
    does and stops nothing of its parent's, which trains on."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(FORKS, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "train.py"],
        cwd=folder,
        env=env_of(slow_provisioning),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "CHILD True" in done.stdout and "TRAINED" in done.stdout, done.stdout
    assert "stopping this script's" not in done.stderr
