"""Fixtures for the Slurm backend tests: a real Slurm (slurmctld + munged + one slurmd a node) of
a preemptible node, `NODE`, and a standard one, `STANDARD_NODE`, alone in partition ``standard``.

`slurm` makes sure a controller answers, starting it with ``.ci/slurm-up`` when it does not (and
stopping what it started at the end). Where Slurm cannot start, the tests that need it are skipped,
except under CI (``CI=true``), where that is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SLURM_UP = REPO / ".ci" / "slurm-up"
SLURM_DOWN = REPO / ".ci" / "slurm-down"
NODE = os.environ.get("TGNB_SLURM_NODE", "localhost")
STANDARD_NODE = os.environ.get("TGNB_SLURM_STANDARD_NODE", "standard")


def fake_train(**knobs: int) -> dict[str, str]:
    """The run's env that sets `fake_train.sh`'s knobs (``sleep``, ``first_exit``, ``exits``,
    ``step``): ``FAKE_TRAIN_SLEEP`` and so on. The knobs are no training config's keys (the run's
    contract refuses unknown keys), so they travel as environment variables."""
    return {f"FAKE_TRAIN_{key.upper()}": str(value) for key, value in knobs.items()}


def _answers() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"Slurm is needed under CI but {why}", pytrace=False)
    pytest.skip(f"no Slurm here: {why}")


def node_state() -> str:
    out = subprocess.run(
        ["sinfo", "-h", "-n", NODE, "-o", "%T"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def set_features(features: str, node: str = NODE) -> None:
    """Make a test node a preemptible one (``"preemptible"``, as slurm.conf has `NODE`) or a
    standard one (``""``: Together's standard nodes carry no feature), at run time."""
    subprocess.run(
        ["scontrol", "update", f"NodeName={node}", f"AvailableFeatures={features}",
         f"ActiveFeatures={features}"],
        check=True, timeout=15,
    )  # fmt: skip


def resume_node() -> None:
    """Bring the test nodes back if a test left them drained (State=RESUME) or of the other
    class (`NODE` standard, `STANDARD_NODE` preemptible)."""
    for node, features in ((NODE, "preemptible"), (STANDARD_NODE, "")):
        proc = subprocess.run(
            ["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=False
        )
        out = proc.stdout
        if proc.returncode != 0 or "NodeName=" not in out:  # no such node (an older slurm-up)
            continue
        if f"AvailableFeatures={features or '(null)'} " not in out:
            set_features(features, node)
        if "DRAIN" in out.split("State=", 1)[-1].split(" ", 1)[0]:
            subprocess.run(
                ["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False, timeout=15
            )


def cluster_state() -> str:
    """What the test cluster looks like now: its queue, its nodes (CPUs allocated/idle/other/total,
    topology, features, reason) and the controller's last log lines."""
    commands = (
        ["squeue", "-a", "-o", "%i %P %j %T %M %C %m %R"],
        ["sinfo", "-N", "-o", "%N %P %T %C %z %f %E"],
        ["tail", "-n", "25", "/var/log/slurm/slurmctld.log"],
    )
    out = []
    for argv in commands:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
            out.append(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}")
        except (OSError, subprocess.TimeoutExpired) as exc:
            out.append(f"$ {' '.join(argv)}\n{exc!r}")
    return "\n".join(out)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test on the real cluster says what the cluster looked like then (CI prints only
    the failure: a job left pending, a node drained or full shows here)."""
    report = yield
    if report.failed and call.when == "call" and "slurm" in getattr(item, "fixturenames", ()):
        report.sections.append(("the Slurm test cluster when it failed", cluster_state()))
    return report


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """The name of the preemptible node of the running Slurm (partitions ``low`` and ``high``)."""
    started = False
    if not _answers():
        if shutil.which("slurmctld") is None and not Path("/usr/sbin/slurmctld").exists():
            _unavailable(
                "slurmctld is not installed (apt-get install slurmctld slurmd slurm-client munge)"
            )
        if os.geteuid() != 0:
            _unavailable("starting slurmctld/slurmd needs root")
        proc = subprocess.run(
            ["bash", str(SLURM_UP)], capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            _unavailable(f".ci/slurm-up failed: {proc.stderr.strip()[-300:]}")
        started = True
    resume_node()
    yield NODE
    resume_node()
    if started:
        subprocess.run(["bash", str(SLURM_DOWN)], check=False, timeout=60)


@pytest.fixture
def cleanup_jobs() -> Iterator[list[str]]:
    """Job ids to cancel after the test, whatever happened."""
    jobs: list[str] = []
    yield jobs
    for job in jobs:
        subprocess.run(["scancel", job], check=False, timeout=30)
    resume_node()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def login_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, tuple[str, ...]]]:
    """A real sshd on 127.0.0.1 (a free port, key login only) standing in for a cluster's login
    node: ``(host, ssh_options)`` for `CommandRunner`. Skipped where openssh-server is missing."""
    import socket
    import time

    sshd = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
    if sshd is None or shutil.which("ssh-keygen") is None or os.geteuid() != 0:
        pytest.skip("needs openssh-server (sshd) and root to stand in for a login node")
    d = tmp_path_factory.mktemp("sshd")
    for key in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True
        )
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    port = _free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nAcceptEnv TGNB_*\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    proc = subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.DEVNULL,
        stderr=open(d / "sshd.log", "w"),  # noqa: SIM115 - closed with the process
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()[-500:]}")
                time.sleep(0.1)
        options = (
            "-p", str(port), "-i", str(d / "client"), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
        )  # fmt: skip
        yield "127.0.0.1", options
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
