"""`SlurmBackend`: runs ``python -m tgnb.train`` as sbatch jobs on a Slurm cluster, here or through a
login node over SSH, and follows them with ``scontrol``/``squeue`` (``sacct`` once a finished job
has left the controller, when the cluster keeps accounting).

A run's directory (script, the run file ``run.json`` and its view ``config.yaml``,
``slurm-<id>.out``, checkpoints, ``events.jsonl``, ``metrics.jsonl``) lives on the cluster's
shared storage under `runs_root`/<run name>, and is the job's working directory, so it can be
found again from the job id alone.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tgnb.backends.base import JobState, JobStatus, RunSpec
from tgnb.backends.slurm import groups, placer
from tgnb.backends.slurm.commands import CommandRunner
from tgnb.backends.slurm.records import job_status, parse_fields
from tgnb.backends.slurm.render import (
    CONFIG_NAME,
    RUN_FILE_NAME,
    SCRIPT_NAME,
    RenderOptions,
    gres_gpus,
    render_config,
    render_script,
)
from tgnb.config import Settings
from tgnb.errors import BackendError, ValidationError
from tgnb.events import RUN_EXITED, Event, read_jsonl
from tgnb.runs import budget, ft, ftcheck, node
from tgnb.runs.cursor import LogChunk, split_appended
from tgnb.runs.node import Exit
from tgnb.runs.runfile import RunFile

FORGOTTEN = "the controller no longer knows this job (no accounting to ask)"


def _over(status: JobStatus) -> bool:
    """Nothing more will happen: finished, or forgotten by a controller without accounting."""
    return status.state.finished or (
        status.state is JobState.UNKNOWN and status.detail == FORGOTTEN
    )


class SlurmBackend:
    """The Slurm workload backend: one sbatch job per run, requeued by Slurm on preemption.

    `host`: a login node to reach over SSH (None: this machine). `runs_root`: where run directories
    go on shared storage (default ``$TGNB_HOME/runs`` here, ``$HOME/tgnb-runs`` on a login node).
    `gres`: True (the default) reads the GPUs a node has from its GRES (`node_gpus`: none, one
    process) and asks for ``--gres=gpu:N``; False is for a cluster that does not declare GPUs as
    GRES: no ``--gres``, and the run's ``gpus_per_node`` stands for the GPUs of a node.
    `python`: the interpreter on the nodes (default: this one when local, ``python`` over SSH).
    `placer_poll_seconds`: how often a run's placer job looks at its pending job
    (`tgnb.backends.slurm.placer`). `lighthouse_partition`: a partition of standard nodes for the
    lighthouse of a run as TorchFT replica groups (default: any node without the ``preemptible``
    feature; `tgnb.backends.slurm.groups`).
    """

    name = "slurm"

    def __init__(
        self,
        host: str | None = None,
        *,
        runs_root: str | os.PathLike[str] | None = None,
        gres: bool = True,
        python: str | None = None,
        runner: CommandRunner | None = None,
        poll_seconds: float = 1.0,
        placer_poll_seconds: float = 5.0,
        lighthouse_partition: str | None = None,
    ) -> None:
        self.runner = runner or CommandRunner(host)
        self._runs_root = None if runs_root is None else str(runs_root)
        self.options = RenderOptions(
            gres=gres, python=python or (sys.executable if self.runner.host is None else "python")
        )
        self.poll_seconds = poll_seconds
        self.placer_poll_seconds = placer_poll_seconds
        self.lighthouse_partition = lighthouse_partition
        self._run_dirs: dict[str, str] = {}
        self._accounting: bool | None = None
        self._group_runs: dict[str, bool] = {}  # job id: a run as replica groups (`log_path`)

    # Where runs live.

    @property
    def runs_root(self) -> str:
        if self._runs_root is None:
            if self.runner.host is None:
                self._runs_root = str(Settings.from_env().home / "runs")
            else:
                home = self.runner.run(["sh", "-c", 'printf %s "$HOME"']).stdout.strip()
                self._runs_root = f"{home}/tgnb-runs"
        return self._runs_root

    def run_dir_for(self, spec: RunSpec | str) -> str:
        """The run directory of `spec` (or of a run name): its own `run_dir`, else
        `runs_root`/<name>. Stable across requeues: never a timestamp."""
        if isinstance(spec, RunSpec) and spec.run_dir:
            return spec.run_dir
        name = spec.name if isinstance(spec, RunSpec) else spec
        return f"{self.runs_root.rstrip('/')}/{name}"

    def render(self, spec: RunSpec) -> tuple[str, str]:
        """``(script, config_yaml)`` of `spec`, as they will be submitted."""
        run_dir = (
            os.path.abspath(self.run_dir_for(spec))
            if self.runner.host is None
            else self.run_dir_for(spec)
        )
        gpus = self.node_gpus(spec.partition) if self.options.gres else None  # no GRES: asked
        options = dataclasses.replace(self.options, node_gpus=gpus)
        return render_script(spec, run_dir, options), render_config(spec)

    def node_gpus(self, partition: str | None = None) -> int | None:
        """The most GPUs a node of `partition` (every partition: None) has, from Slurm's GRES
        (``sinfo -o %G``); None when sinfo does not answer (the run's own count then holds)."""
        cmd = ["sinfo", "-h", "-o", "%G", *(["-p", partition] if partition else [])]
        try:
            proc = self.runner.run(cmd, check=False)
        except BackendError:  # no sinfo here, no answer: `preflight` says so
            return None
        return gres_gpus(proc.stdout) if proc.returncode == 0 else None

    # The Backend protocol.

    def preflight(self, spec: RunSpec) -> tuple[str, str, dict[str, str]]:
        """Everything `submit` checks before it writes or submits anything: the spec renders,
        Slurm's commands exist and the controller answers, the secrets are set. Returns the
        script, the config and the secrets' environment."""
        ftcheck.refuse_moves(spec, "Slurm")  # replica groups: no placer per group here
        script, config = self.render(spec)
        self.runner.preflight()
        if groups.is_groups(spec):
            self._check_groups()
        env: dict[str, str] = {}
        for name, ref in sorted(spec.secrets.items()):
            source = ref.env or name
            if self.runner.host is None and not os.environ.get(source):
                raise ValidationError(
                    f"secret {name} is read from ${source}, which is not set here: export it "
                    "before submitting (its value is never written into the script)"
                )
            if source in os.environ:
                env[source] = os.environ[source]
        return script, config, env

    def submit(self, spec: RunSpec, prepared: tuple[str, str, dict[str, str]] | None = None) -> str:
        """Send what `preflight` rendered (`prepared`; rendered afresh when None): write the
        script, the run file (`tgnb.runs.runfile`, what the node reads) and its config view into
        the run directory and ``sbatch`` it; the job id."""
        script, config, env = prepared or self.preflight(spec)
        run_dir = self._run_dir_of_script(script)
        script_path = f"{run_dir}/{SCRIPT_NAME}"
        snapshot = spec.workdir_snapshot()
        if snapshot is not None:  # once: every requeue of the job uses this snapshot
            self.runner.write_tree(f"{run_dir}/{node.WORKDIR}", snapshot.tar())
        self.runner.write_file(f"{run_dir}/{RUN_FILE_NAME}", RunFile(spec, time.time()).to_json())
        self.runner.write_file(f"{run_dir}/{CONFIG_NAME}", config)
        self.runner.write_file(script_path, script, mode=0o755)
        lighthouse = self._submit_lighthouse(spec, run_dir) if groups.is_groups(spec) else None
        after = [f"--dependency=after:{lighthouse}"] if lighthouse else []
        try:
            out = self.runner.run(
                ["sbatch", "--parsable", *after, script_path], env=env
            ).stdout.strip()
        except BackendError as exc:
            if lighthouse is not None:
                self.runner.run(["scancel", lighthouse], check=False)
            raise self._explain_refusal(spec, exc) from None
        job_id = out.split(";")[0].strip()
        if lighthouse is not None:  # the lighthouse stops once this array has left the queue
            self.runner.write_file(f"{run_dir}/{groups.GROUPS_JOB_FILE}", job_id + "\n")
        if not job_id.isdigit():
            raise BackendError(
                f"sbatch answered {out!r} instead of a job id: check sbatch --parsable"
            )
        self._run_dirs[job_id] = run_dir
        if placer.needs_placer(spec.policy):
            self._submit_placer(spec, run_dir, job_id)
        return job_id

    def _submit_placer(self, spec: RunSpec, run_dir: str, job_id: str) -> None:
        """Submit the run's placer job (`tgnb.backends.slurm.placer`; it needs none of the run's
        secrets); if that fails, the run's job is cancelled (a run without its policy is not left
        behind) and the error raised."""
        script, config = placer.render_placer(
            spec, run_dir, self.options.python, time.time(), self.placer_poll_seconds
        )
        try:
            self.runner.write_file(f"{run_dir}/{placer.CONFIG_NAME}", config)
            self.runner.write_file(f"{run_dir}/{placer.SCRIPT_NAME}", script, mode=0o755)
            out = self.runner.run(
                ["sbatch", "--parsable", f"{run_dir}/{placer.SCRIPT_NAME}", job_id]
            ).stdout.strip()
            placer_id = out.split(";")[0].strip()
            if not placer_id.isdigit():
                raise BackendError(f"sbatch answered {out!r} for the run's placer, not a job id")
            self.runner.write_file(f"{run_dir}/{placer.JOB_FILE}", placer_id + "\n")
        except Exception:
            self.runner.run(["scancel", job_id], check=False)
            raise

    def _check_groups(self) -> None:
        """A run as replica groups: the nodes' interpreter imports torchft (asked where the
        commands run: the shared environment the nodes run), and the lighthouse has a node."""
        from tgnb.runs.ftcheck import torchft_missing

        python = self.options.python
        probe = self.runner.run([python, "-c", "import torchft"], check=False)
        if probe.returncode != 0:
            raise torchft_missing(f"for the nodes' Python ({python}) {self.runner.where}")
        self._lighthouse_exclude()

    def _lighthouse_exclude(self) -> list[str]:
        """What keeps the lighthouse of a run as replica groups off the preemptible nodes
        (``--exclude`` of those now; nothing with `lighthouse_partition`); refused when the
        cluster has no standard node."""
        if self.lighthouse_partition:
            return []
        sinfo = self.runner.run(["sinfo", "-h", "-N", "-o", "%N|%f"]).stdout
        if not groups.standard_nodes(sinfo):
            raise ValidationError(
                "the lighthouse of a run as replica groups runs on a standard node, and this "
                "cluster has none: add standard capacity, or give SlurmBackend("
                "lighthouse_partition=...) a partition of standard nodes"
            )
        excluded = groups.preemptible_nodes(sinfo)
        return [f"--exclude={','.join(excluded)}"] if excluded else []

    def _submit_lighthouse(self, spec: RunSpec, run_dir: str) -> str:
        """Submit the run's lighthouse job (`tgnb.backends.slurm.groups`); its job id."""
        script = groups.render_lighthouse(
            spec, run_dir, self.options.python, self.lighthouse_partition
        )
        path = f"{run_dir}/{groups.LIGHTHOUSE_SCRIPT}"
        self.runner.write_file(path, script, mode=0o755)
        exclude = self._lighthouse_exclude()
        out = self.runner.run(["sbatch", "--parsable", *exclude, path]).stdout.strip()
        job_id = out.split(";")[0].strip()
        if not job_id.isdigit():
            raise BackendError(f"sbatch answered {out!r} for the run's lighthouse, not a job id")
        self.runner.write_file(f"{run_dir}/{groups.LIGHTHOUSE_JOB_FILE}", job_id + "\n")
        return job_id

    def _explain_refusal(self, spec: RunSpec, exc: BackendError) -> BackendError:
        """sbatch refuses a job no node could ever run; when that is because the cluster has no
        preemptible node right now (its target is 0, or every one was reclaimed), say so."""
        if "node configuration is not available" not in str(exc) or not spec.resources.preemptible:
            return exc
        proc = self.runner.run(["sinfo", "-h", "-o", "%f"], check=False)
        features = {f for line in proc.stdout.split() for f in line.split(",")}
        if proc.returncode != 0 or placer.PREEMPTIBLE in features:
            return exc
        return BackendError(
            "no node of the cluster has the Slurm feature preemptible now, so sbatch refuses the "
            "run: raise the preemptible target (session.scale(preemptible=8)) and launch again, "
            "or launch with preemptible=False"
        )

    @staticmethod
    def _run_dir_of_script(script: str) -> str:
        for line in script.splitlines():
            if line.startswith("#SBATCH --chdir="):
                return line.split("=", 1)[1]
        raise BackendError("rendered script has no --chdir: this is a bug in tgnb")

    def show(self, job_id: str) -> dict[str, str] | None:
        """The ``scontrol show job`` record of `job_id`, or None once the controller forgot it."""
        lines = self._show_lines(job_id)
        return None if lines is None else parse_fields(lines[0] if lines else "")

    def _show_lines(self, job_id: str) -> list[str] | None:
        """Every line of ``scontrol show job -o`` (an array: one per task), or None once the
        controller forgot it."""
        proc = self.runner.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return None
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            raise BackendError(
                f"scontrol show job {job_id} failed {self.runner.where}: "
                f"{detail[-1] if detail else proc.returncode}"
            )
        lines = proc.stdout.strip().splitlines()
        fields = parse_fields(lines[0] if lines else "")
        if fields.get("WorkDir"):
            self._run_dirs.setdefault(str(job_id), fields["WorkDir"])
        return lines

    def status(self, job_id: str) -> JobStatus:
        lines = self._show_lines(job_id)
        if lines is None:
            found = self._finished_status(job_id)
        elif lines and "ArrayTaskId=" in lines[0]:  # replica groups: one array task each
            found = groups.array_status(lines)
        else:
            found = job_status(parse_fields(lines[0] if lines else ""))
        if found.exit_code == int(Exit.STOPPED) and str(job_id) in self._run_dirs:
            return budget.settle(found, self.events(job_id))  # its budget, or its own exit 77
        return found

    def _finished_status(self, job_id: str) -> JobStatus:
        if self._accounting is None:
            self._accounting = self.runner.has_accounting()
        if self._accounting:
            out = self.runner.run(
                ["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State,ExitCode,NodeList"]
            ).stdout.strip()
            if out:
                state, exit_code, nodelist = [*out.splitlines()[-1].split("|"), "", ""][:3]
                return job_status(
                    {"JobState": state.split()[0], "ExitCode": exit_code, "NodeList": nodelist}
                )
        # No accounting: the run's own events say how it ended.
        if str(job_id) not in self._run_dirs:
            return JobStatus(JobState.UNKNOWN, 0, (), None, FORGOTTEN)
        for ev in reversed(self.events(job_id)):
            if ev.reason == RUN_EXITED:
                code = int(ev.data.get("exit_code", ev.data.get("code", 1)) or 0)
                state = JobState.SUCCEEDED if code == 0 else JobState.FAILED
                return JobStatus(state, 0, (), code, "finished (from events.jsonl)")
        return JobStatus(JobState.UNKNOWN, 0, (), None, FORGOTTEN)

    def restart_count(self, job_id: str) -> int:
        return self.status(job_id).restart_count

    def recover(self, job_id: str) -> bool:
        """False: slurmctld keeps a job going (and requeues it) without tgnb."""
        return False

    def cancel(self, job_id: str) -> None:
        """Cancel the run's job, and its placer or lighthouse job when it has one."""
        self.runner.run(["scancel", str(job_id)])
        for helper in (placer.JOB_FILE, groups.LIGHTHOUSE_JOB_FILE):
            try:
                helper_id = self.runner.read_file(f"{self.run_dir(job_id)}/{helper}")
            except (BackendError, OSError):
                return  # no run directory to find it in
            if helper_id.strip().isdigit():
                self.runner.run(["scancel", helper_id.decode().strip()], check=False)

    def requeue(self, job_id: str) -> None:
        """Ask Slurm to requeue the job now (as a preemption would)."""
        self.runner.run(["scontrol", "requeue", str(job_id)])

    def attach(self, job_id: str, run_dir: str | os.PathLike[str]) -> None:
        """Remember where a job's run directory is (from the run store, after a kernel restart),
        so status, logs and events still work once the controller has forgotten the job."""
        self._run_dirs[str(job_id)] = str(run_dir)

    def run_dir(self, job_id: str) -> str:
        """The job's run directory (its working directory on shared storage)."""
        if str(job_id) not in self._run_dirs:
            self.show(job_id)
        try:
            return self._run_dirs[str(job_id)]
        except KeyError:
            raise BackendError(
                f"job {job_id} is unknown to the controller and to this session: "
                "open its run directory from the run store instead"
            ) from None

    def log_path(self, job_id: str) -> str:
        """The job's output file; for a run as replica groups (an array: one log per group),
        the log of the group that checkpoints (`tgnb.runs.ft.CHECKPOINT_GROUP`)."""
        run_dir = self.run_dir(job_id)
        if str(job_id) not in self._group_runs:  # read once: its groups' job file
            marker = self.runner.read_file(f"{run_dir}/{groups.GROUPS_JOB_FILE}")
            self._group_runs[str(job_id)] = marker.strip() == str(job_id).encode()
        if self._group_runs[str(job_id)]:
            return f"{run_dir}/slurm-{job_id}_{ft.CHECKPOINT_GROUP}.out"
        return f"{run_dir}/slurm-{job_id}.out"

    def logs(self, job_id: str, follow: bool = False) -> Iterator[str]:
        """Lines of the job's output file; with `follow`, until the job has finished."""
        path = self.log_path(job_id)
        offset = 0
        pending = b""
        while True:
            finished = not follow or _over(self.status(job_id))
            chunk = self.runner.read_file(path, offset)
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.decode("utf-8", errors="replace")
            if finished:
                if pending:
                    yield pending.decode("utf-8", errors="replace")
                return
            time.sleep(self.poll_seconds)

    def logs_after(self, job_id: str, after: int | None = None) -> LogChunk:
        """The lines of the job's output file written after byte `after` (None: from its
        start), and the offset to read from next: the file is opened in append mode across
        requeues, so an offset stays valid; over SSH only the bytes after it are sent
        (`CommandRunner.read_file`)."""
        offset = int(after or 0)
        return split_appended(self.runner.read_file(self.log_path(job_id), offset), offset)

    def events(self, job_id: str) -> list[Event]:
        """The run's own events (``events.jsonl`` in its run directory)."""
        run_dir = self.run_dir(job_id)
        if self.runner.host is None:
            return list(read_jsonl(Path(run_dir) / "events.jsonl"))
        data = self.runner.read_file(f"{run_dir}/events.jsonl")
        with tempfile.TemporaryDirectory(prefix="tgnb-slurm-") as tmp:
            path = Path(tmp) / "events.jsonl"
            path.write_bytes(data)
            return list(read_jsonl(path))

    def wait(self, job_id: str, timeout: float = 600.0) -> JobStatus:
        """Poll until the job has finished (or `timeout` seconds passed); its last status."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(job_id)
            if _over(st) or time.monotonic() > deadline:
                return st
            time.sleep(self.poll_seconds)
