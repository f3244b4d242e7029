"""Bad input and faults of the Slurm command runner: one-line `BackendError`s naming the fix, raised
before anything is written or submitted. The commands are real (a PATH without Slurm, a loopback
address with no sshd, a slurm.conf pointing at a port where no controller listens)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tgnb.backends.base import Resources, RunSpec
from tgnb.backends.slurm import CommandRunner, SlurmBackend
from tgnb.backends.slurm.commands import REQUIRED
from tgnb.errors import BackendError

SPEC = RunSpec(name="r1", train={"algorithm": "grpo"}, resources=Resources(gpus_per_node=0))


def _nothing_written(runs_root: Path) -> bool:
    return not any(runs_root.rglob("*"))


def test_missing_sbatch_names_the_fix(tmp_path: Path) -> None:
    empty_path = tmp_path / "bin"
    empty_path.mkdir()
    runs = tmp_path / "runs"
    backend = SlurmBackend(runner=CommandRunner(path=str(empty_path)), runs_root=runs)
    with pytest.raises(BackendError) as err:
        backend.submit(SPEC)
    msg = str(err.value)
    assert "\n" not in msg
    assert "sbatch" in msg and "slurm-client" in msg
    assert _nothing_written(runs)


def test_only_the_missing_commands_are_named(tmp_path: Path) -> None:
    sbin = tmp_path / "bin"
    sbin.mkdir()
    real = shutil.which("scontrol")
    if real is None:
        pytest.skip("scontrol is not installed here")
    (sbin / "scontrol").symlink_to(real)
    runner = CommandRunner(path=str(sbin))
    with pytest.raises(BackendError) as err:
        runner.preflight()
    missing = [name for name in REQUIRED if name != "scontrol"]
    assert all(name in str(err.value) for name in missing)
    assert "scontrol," not in str(err.value)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_unreachable_login_node(tmp_path: Path) -> None:
    """127.0.0.2 is loopback with no sshd on port 22: ssh fails at once (exit 255)."""
    runner = CommandRunner(
        "127.0.0.2",
        ssh_options=(
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=2",
            "-o",
            "StrictHostKeyChecking=no",
        ),
        timeout=20,
    )
    backend = SlurmBackend(runner=runner, runs_root="/tmp/never-written")
    with pytest.raises(BackendError) as err:
        backend.submit(SPEC)
    msg = str(err.value)
    assert "\n" not in msg
    assert "127.0.0.2" in msg and "ssh -o BatchMode=yes 127.0.0.2 true" in msg


def test_ssh_argv_is_quoted() -> None:
    runner = CommandRunner("login.example", ssh_options=())
    argv = runner.argv(["sbatch", "--parsable", "/runs/a b/job.sbatch"], send_env=["HF_TOKEN"])
    assert argv == [
        "ssh",
        "-o",
        "SendEnv=HF_TOKEN",
        "login.example",
        "--",
        "sbatch --parsable '/runs/a b/job.sbatch'",
    ]


def test_controller_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real `scontrol ping` against a slurm.conf whose controller port has nothing listening."""
    conf = Path("/etc/slurm/slurm.conf")
    if shutil.which("scontrol") is None or not conf.exists():
        pytest.skip("Slurm's client and slurm.conf are not installed here")
    bad = tmp_path / "slurm.conf"
    bad.write_text(conf.read_text() + "\nSlurmctldPort=9\n")
    monkeypatch.setenv("SLURM_CONF", str(bad))
    runs = tmp_path / "runs"
    backend = SlurmBackend(runs_root=runs)
    with pytest.raises(BackendError) as err:
        backend.submit(SPEC)
    assert "controller does not answer" in str(err.value)
    assert "\n" not in str(err.value)
    assert _nothing_written(runs)
