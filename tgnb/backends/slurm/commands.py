"""Runs Slurm's client commands (``sbatch``, ``squeue``, ``scontrol``, ``scancel``, ``sacct``) on
this machine or on a cluster's login node over SSH (``ssh HOST -- CMD``, the command quoted with
`shlex.join` so the remote shell sees the same argv).

Every command runs in a clean environment (`clean_environ`): the variables that find programs,
the user's home and locale (`SUBMIT_ENV`, `SUBMIT_ENV_PREFIXES`) and what a call adds, never the
kernel's whole ``os.environ``. sbatch's job inherits sbatch's environment (``--export=ALL``), so a
job gets what the run declares (its ``env`` in the script, its ``secrets`` added here) and no
``TOGETHER_API_KEY`` or ``HF_TOKEN`` of the kernel: nodes hold no API key.

`CommandRunner.preflight` checks, before anything is submitted, that the commands exist and that
the controller answers; every failure is a one-line `BackendError` that names the fix.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from tgnb.atomic import atomic_write
from tgnb.errors import BackendError

#: The commands a submission needs. ``sacct`` is used only when the cluster keeps accounting.
REQUIRED = ("sbatch", "squeue", "scontrol", "scancel")
SSH_UNREACHABLE = 255  # what ssh itself exits with when it cannot connect or authenticate
#: What Slurm's commands, ssh and the job's Python need from the submitting environment: programs
#: and libraries found, the user's home and locale, Slurm's config. Anything else a run needs is
#: declared in its ``env=`` (or ``secrets=``).
SUBMIT_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "SLURM_CONF",
    "SSH_AUTH_SOCK",
)  # fmt: skip
SUBMIT_ENV_PREFIXES = ("LC_",)


def clean_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default ``os.environ``) a submission keeps (`SUBMIT_ENV`)."""
    environ = os.environ if environ is None else environ
    return {
        k: v for k, v in environ.items() if k in SUBMIT_ENV or k.startswith(SUBMIT_ENV_PREFIXES)
    }


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


class CommandRunner:
    """Slurm's commands, run here (`host` None) or on the login node `host` over SSH.

    Commands run in `clean_environ`; `env` adds variables to the environment of local commands (and, over SSH, names sent with
    ``SendEnv``, which the login node's sshd must ``AcceptEnv``); values never appear in an argv.
    """

    def __init__(
        self,
        host: str | None = None,
        *,
        ssh_options: Sequence[str] = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10"),
        timeout: float = 60.0,
        path: str | None = None,
    ) -> None:
        self.host = host
        self.ssh_options = tuple(ssh_options)
        self.timeout = timeout
        self.path = path  # PATH used to find local commands; None: the process's own
        self._checked = False

    @property
    def where(self) -> str:
        return f"on {self.host}" if self.host else "on this machine"

    def argv(self, cmd: Sequence[str], send_env: Sequence[str] = ()) -> list[str]:
        """The argv that runs `cmd` here or on the login node."""
        if self.host is None:
            return list(cmd)
        opts: list[str] = list(self.ssh_options)
        for name in send_env:
            opts += ["-o", f"SendEnv={name}"]
        return ["ssh", *opts, self.host, "--", shlex.join(cmd)]

    def _environ(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = clean_environ()
        if self.path is not None:
            out["PATH"] = self.path
        if env:
            out.update(env)
        return out

    def run(
        self,
        cmd: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `cmd`; with `check`, a non-zero exit is a `BackendError` quoting its last line."""
        argv = self.argv(cmd, send_env=list(env or {}))
        exe = shutil.which(argv[0], path=self._environ(None).get("PATH"))
        if exe is None:
            raise BackendError(self._missing_message([argv[0]]))
        try:
            proc = subprocess.run(
                [exe, *argv[1:]],
                input=input,
                capture_output=True,
                text=True,
                env=self._environ(env),
                timeout=timeout or self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackendError(
                f"{cmd[0]} {self.where} did not answer within {exc.timeout:.0f}s: check that the "
                "Slurm controller is up (scontrol ping) and the login node is reachable"
            ) from None
        if self.host is not None and proc.returncode == SSH_UNREACHABLE:
            raise BackendError(self._unreachable_message(proc.stderr))
        if check and proc.returncode != 0:
            detail = _last_line(proc.stderr) or _last_line(proc.stdout) or f"exit {proc.returncode}"
            raise BackendError(f"{shlex.join(cmd[:3])} failed {self.where}: {detail}")
        return proc

    def _missing_message(self, names: Sequence[str]) -> str:
        listed = ", ".join(names)
        if self.host is None and names == ["ssh"]:
            return "ssh not found on PATH: install openssh-client to reach a Slurm login node"
        if self.host is None:
            return (
                f"Slurm command(s) {listed} not found on PATH {self.where}: install slurm-client "
                "(apt-get install slurm-client) or give the login node with host= to submit over SSH"
            )
        return (
            f"Slurm command(s) {listed} not found on PATH on {self.host}: load Slurm there "
            "(module load slurm) or give the right login node with host="
        )

    def _unreachable_message(self, stderr: str) -> str:
        detail = _last_line(stderr) or "no answer"
        return (
            f"cannot reach the Slurm login node {self.host} over SSH ({detail}): check the host "
            f"name and that `ssh -o BatchMode=yes {self.host} true` works (keys, known_hosts)"
        )

    def preflight(self) -> None:
        """Check once that Slurm's commands exist and the controller answers; else raise."""
        if self._checked:
            return
        if self.host is None:
            path = self._environ(None).get("PATH")
            missing = [name for name in REQUIRED if shutil.which(name, path=path) is None]
        else:
            probe = (
                "for c in " + " ".join(REQUIRED) + "; do command -v $c >/dev/null || echo $c; done"
            )
            out = self.run(["sh", "-c", probe], check=False)
            missing = out.stdout.split()
        if missing:
            raise BackendError(self._missing_message(missing))
        ping = self.run(["scontrol", "ping"], check=False, timeout=min(self.timeout, 30.0))
        if ping.returncode != 0 or "UP" not in ping.stdout:
            lines = (ping.stdout + "\n" + ping.stderr).strip().splitlines()
            detail = next(
                (x.strip() for x in lines if "Slurmctld" in x or "error" in x), "no answer"
            )
            raise BackendError(
                f"the Slurm controller does not answer {self.where} ({detail}): start slurmctld "
                "(.ci/slurm-up on a test machine) or check SlurmctldHost in slurm.conf"
            )
        self._checked = True

    def has_accounting(self) -> bool:
        """Whether the cluster keeps job accounting (then ``sacct`` knows finished jobs)."""
        out = self.run(["scontrol", "show", "config"], check=False)
        for line in out.stdout.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "AccountingStorageType":
                return value.strip() not in ("", "accounting_storage/none", "(null)")
        return False

    # Files on the cluster's shared storage (the run directory).

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Write `text` to `path` (creating its directory) here or on the login node."""
        if self.host is None:
            atomic_write(path, text, mode=mode)
            return
        q = shlex.quote(path)
        script = (
            f"mkdir -p {shlex.quote(os.path.dirname(path) or '.')} && cat > {q}.tmp$$ && "
            f"chmod {mode:o} {q}.tmp$$ && mv {q}.tmp$$ {q}"
        )
        self.run(["sh", "-c", script], input=text)

    def write_tree(self, path: str, tar_gz: bytes) -> None:
        """Unpack the gzipped tar `tar_gz` into the folder `path` (created), here or on the
        login node (as base64 through ``base64 -d | tar -xzf -``)."""
        if self.host is None:
            import io
            import tarfile

            os.makedirs(path, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(tar_gz), mode="r:gz") as tar:
                tar.extractall(path, filter="data")
            return
        import base64

        q = shlex.quote(path)
        self.run(
            ["sh", "-c", f"mkdir -p {q} && base64 -d | tar -xzf - -C {q}"],
            input=base64.b64encode(tar_gz).decode("ascii"),
        )

    def read_file(self, path: str, offset: int = 0) -> bytes:
        """The bytes of `path` from `offset` on (empty if it does not exist yet)."""
        if self.host is None:
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    return fh.read()
            except FileNotFoundError:
                return b""
        argv = self.argv(["sh", "-c", f"tail -c +{offset + 1} {shlex.quote(path)} 2>/dev/null"])
        exe = shutil.which(argv[0]) or argv[0]
        try:
            proc = subprocess.run([exe, *argv[1:]], capture_output=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise BackendError(f"reading {path} on {self.host} timed out") from None
        if proc.returncode == SSH_UNREACHABLE:
            raise BackendError(self._unreachable_message(proc.stderr.decode(errors="replace")))
        return proc.stdout
