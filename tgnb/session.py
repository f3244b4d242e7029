"""`Session`: the attached cluster, its workload backend and the run store, as one object.

Everything the notebook surface does is a call on a `Session` or a `Run`::

    import tgnb
    s = tgnb.attach()                       # no API key: the local emulator and a demo cluster
    s.scale(preemptible=16, wait=True)      # raise the preemptible target, wait for capacity
    run = s.launch("grpo", max_steps=60)    # on preemptible nodes by default
    run.wait(); run.metrics()

Bad input is refused before anything is sent or recorded (`tgnb.errors.ValidationError`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tgnb.config import Settings
from tgnb.connection import REMOTE_POLL, Emulator
from tgnb.errors import NotFoundError, TgnbError, ValidationError
from tgnb.events import Event, dedupe, parse_since
from tgnb.preemption import Preemption
from tgnb.prices import Prices, check_budget
from tgnb.runs.backend import Backend
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.run import Run
from tgnb.runs.spec import GPUS_PER_NODE, JobState, Resources, SecretRef
from tgnb.runs.store import RunStore

if TYPE_CHECKING:
    from tgnb.cloud import Cloud, Cluster, ClusterState, WaitResult
    from tgnb.runs.call import Executor
    from tgnb.runs.sweeps import Sweep

#: The sweep every run launched joins (`tgnb.batch`: papermill notebooks run as one sweep).
SWEEP_ENV = "TGNB_SWEEP"
#: The cluster `attach()` creates on the local emulator when none is named.
DEMO_CLUSTER = "tgnb-demo"


class Session:
    """One attached cluster (`cluster`, through `cloud`), its `backend` and the run `store`.

    `emulator`: the emulator-only operations (`tgnb.connection.Emulator`) when the cluster is on
    the local emulator (what `attach` attached to: the emulator tgnb started, or the tgnb home's
    that ``TOGETHER_BASE_URL`` names), else None; it also picks the ``local`` backend, which runs
    the runs on the emulator's nodes. `poll`: seconds between status reads while waiting."""

    def __init__(
        self,
        cloud: Cloud,
        cluster: Cluster,
        *,
        store: RunStore | None = None,
        backend: str | Backend | None = None,
        backend_options: Mapping[str, Any] | None = None,
        emulator: Emulator | None = None,
        poll: float = REMOTE_POLL,
    ) -> None:
        self.cloud = cloud
        self.emulator = emulator
        self.poll = poll
        self.cluster = cluster
        self.home = cloud.settings.home
        self.store = store or RunStore(self.home)
        self._backend_choice = backend
        self._backend_options = dict(backend_options or {})
        self._backend: Backend | None = None

    def __repr__(self) -> str:
        s = self.cluster.last
        return (
            f"<Session cluster={s.name} ({s.id}) {s.type} backend={self.backend_name} "
            f"preemptible {s.allocated_preemptible_gpus}/{s.desired_preemptible_gpus} GPUs>"
        )

    # -- the backend ---------------------------------------------------------------------------

    @property
    def backend_name(self) -> str:
        from tgnb.backends.registry import backend_name

        if self._backend is not None:
            return self._backend.name
        choice = self._backend_choice
        if choice is not None and not isinstance(choice, str):
            return choice.name
        return backend_name(self.cluster.last, self.emulator is not None, choice)

    @property
    def backend(self) -> Backend:
        """The workload backend of the attached cluster (built on first use)."""
        if self._backend is None:
            from tgnb.backends.registry import choose_backend

            self._backend = choose_backend(
                self.cloud,
                self.cluster.last,
                self.store,
                self._backend_choice,
                local=self.emulator is not None,
                **self._backend_options,
            )
        return self._backend

    # -- the cluster ---------------------------------------------------------------------------

    def status(self) -> ClusterState:
        """The cluster now: target against allocated, standard and preemptible nodes."""
        return self.cluster.state()

    def prices(
        self, standard: float | None = None, preemptible: float | None = None
    ) -> Prices | None:
        """USD per GPU-hour of the cluster's standard and preemptible nodes (`tgnb.prices`:
        `standard` / `preemptible` override, else the platform's, else the published rates of
        its GPU type); None when none are known."""
        return self.cluster.state().prices(standard, preemptible)

    def scale(
        self,
        preemptible: int,
        wait: bool = False,
        timeout: float = 900.0,
        poll: float | None = None,
        callback: Callable[[ClusterState], Any] | None = None,
    ) -> ClusterState | WaitResult:
        """Set the preemptible GPU target (a multiple of 8); with `wait`, wait for capacity."""
        state = self.cluster.scale(preemptible)
        if not wait:
            return state
        poll = poll if poll is not None else self.poll
        return self.cluster.wait_for_capacity(timeout=timeout, poll=poll, callback=callback)

    def preempt(
        self, node: str | None = None, *, run: Run | None = None, timeout: float | None = 900.0
    ) -> Preemption:
        """Emulator only: preempt `node` now; the node, when its notice came and when it goes
        away. With `run` instead, the run's node, once the run is placed and has trained a step
        (waiting up to `timeout` seconds; a run that finished first is a `ValidationError`).
        With neither, the oldest running preemptible node."""
        if self.emulator is None:
            raise ValidationError(
                "preempt works only on the local emulator: Together preempts real nodes itself"
            )
        if run is not None and node is None:
            st = run.wait_for_step(1, timeout=timeout, poll=min(self.poll, 0.5))
            if st.state.finished:
                raise ValidationError(
                    f"run {run.name!r} has {st.state.value}: nothing of it to preempt "
                    "(name a node to preempt one)"
                )
            node = st.nodes[0]
        try:
            return Preemption.from_view(self.emulator.preempt(self.cluster.id, node))
        except ValidationError as exc:
            raise ValidationError(self._preempt_refused(node, str(exc))) from None

    def _preempt_refused(self, node: str | None, message: str) -> str:
        """The emulator's refusal in words (its message, not its JSON) and the nodes to choose."""
        try:
            running = [n.name for n in self.status().preemptible_nodes if n.status == "Ready"]
        except TgnbError:
            running = []
        choose = ", ".join(running) if running else "none (raise the preemptible target first)"
        return f"cannot preempt {node or 'a node'}: {message}; running preemptible nodes: {choose}"

    def events(self, since: datetime | timedelta | str | None = None) -> list[Event]:
        """The cluster's node events and this cluster's runs' events, by time, since `since`."""
        try:
            start = parse_since(since)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        evs = list(self.cluster.events())
        for run in self.runs():
            evs.extend(run.run_events())
        return [e for e in dedupe(evs) if start is None or e.time >= start]

    # -- runs ----------------------------------------------------------------------------------

    def _run(self, record: Any) -> Run:
        return Run(record, self.store, self.backend, self.cluster)

    def runs(self, all_clusters: bool = False) -> list[Run]:
        """Runs launched on this cluster (every run in the store with `all_clusters`)."""
        cluster_id = None if all_clusters else self.cluster.id
        return [self._run(r) for r in self.store.list(cluster_id=cluster_id)]

    def run(self, name: str) -> Run:
        """Reattach to a run by name or id (a run launched by an earlier kernel too)."""
        return self._run(self.store.get(name))

    def sync(self) -> list[Run]:
        """Bring the run store up to what the engine says of this cluster's unfinished runs
        (`Run.sync` each; `Run.wait` does it for its own run). The runs it looked at."""
        runs = [self._run(r) for r in self.store.list(cluster_id=self.cluster.id, active=True)]
        for run in runs:
            run.sync()
        return runs

    def recover(self) -> list[str]:
        """Start again what keeps this cluster's unfinished runs going where it is gone (the local
        backend: their supervisors, after a machine restart). The names of the runs restarted."""
        backend = self.backend
        active = self.store.list(cluster_id=self.cluster.id, active=True)
        return [r.name for r in active if backend.recover(r.job_id or r.id)]

    def _check_capacity(self, res: Resources, state: ClusterState) -> None:
        node_gpus = max((n.gpus for n in state.nodes), default=GPUS_PER_NODE) or GPUS_PER_NODE
        if res.gpus_per_node > node_gpus:
            raise ValidationError(
                f"gpus_per_node={res.gpus_per_node} but nodes of {state.name} have {node_gpus} "
                f"GPUs: use gpus_per_node<={node_gpus} and more nodes"
            )
        least = res.min_nodes or res.nodes
        if res.preemptible:
            target = state.desired_preemptible_gpus
            if target == 0:
                want = max(GPUS_PER_NODE, least * GPUS_PER_NODE)
                raise ValidationError(
                    f"the preemptible target of {state.name} is 0, so no preemptible node will "
                    f"come: run session.scale(preemptible={want}) first, or launch with "
                    "preemptible=False"
                )
            if least * GPUS_PER_NODE > target:
                want = least * GPUS_PER_NODE
                raise ValidationError(
                    f"{least} preemptible node(s) needed but the target of {state.name} is "
                    f"{target} GPUs ({target // GPUS_PER_NODE} nodes): run "
                    f"session.scale(preemptible={want}) first, or ask for fewer nodes"
                )
        else:
            have = len(state.standard_nodes) or state.num_gpus // GPUS_PER_NODE
            if least > have:
                raise ValidationError(
                    f"{least} standard node(s) needed but {state.name} has {have}: "
                    f"ask for nodes<={have}, or run on preemptible nodes"
                )

    def launch(
        self,
        what: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        *,
        command: list[str] | None = None,
        args: list[str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        name: str | None = None,
        preemptible: bool = True,
        nodes: int = 1,
        min_nodes: int | None = None,
        gpus_per_node: int = GPUS_PER_NODE,
        image: str | None = None,
        partition: str | None = None,
        account: str | None = None,
        time_limit: str | None = None,
        env: Mapping[str, str] | None = None,
        secrets: Mapping[str, SecretRef] | None = None,
        recovery: RecoveryPolicy | Mapping[str, Any] | str | None = None,
        budget_usd: float | None = None,
        prices: Prices | None = None,
        dry_run: bool = False,
        files: Mapping[str, bytes] | None = None,
        **train_overrides: Any,
    ) -> Any:
        """Launch a training run and return its `Run` (with `dry_run`: check everything and
        return the config as the node will run it, as YAML text, launching nothing).

        `what`: ``"grpo"``/``"dpo"``/``"sft"`` (the built-in tiny task), a script (``"train.py"``,
        run with `args`), a YAML file or a mapping; or `command` (``["accelerate", "launch",
        "train.py"]``). A script or command runs in a snapshot of `workdir` (default: the
        notebook's or the calling script's folder; `tgnb.runs.workdir`). `recovery`: a
        `tgnb.runs.recovery.RecoveryPolicy`, a mapping of its fields or a `when_short` name
        (``"shrink"``); default: wait for preemptible capacity. `budget_usd`: stop the run (it
        checkpoints) once its GPU-hours cost that many dollars, with a notice at 80 %, at
        `prices` (default: the cluster's, `prices`). `files` (name: bytes) go into the
        workdir snapshot beside its own files (how `submit` ships its call). `train_overrides` set
        config keys (``max_steps=60``, ``trl={...}``, ``checkpoint={...}`` merge). Everything is
        checked first (`tgnb.prelaunch`: the config, the script, datasets and rewards in the
        workdir, TRL's options; the name; what the cluster can hold); on bad input nothing is
        recorded or submitted.
        """
        from tgnb import prelaunch

        res = Resources(
            nodes=nodes, min_nodes=min_nodes, gpus_per_node=gpus_per_node, preemptible=preemptible
        )
        read: list[ClusterState] = []  # the cluster read once, after the checks, if at all

        def state() -> ClusterState:
            read[:] = read or [self.cluster.state()]
            return read[0]

        if check_budget(budget_usd) is not None and prices is None:
            prices = state().prices()

        plan = prelaunch.plan(
            what,
            command=command,
            args=args,
            workdir=workdir,
            name=name,
            overrides=train_overrides,
            state=state,
            resources=res,
            image=image,
            partition=partition,
            account=account,
            time_limit=time_limit,
            env=dict(env or {}),
            secrets=dict(secrets or {}),
            recovery=RecoveryPolicy.coerce(recovery),
            budget_usd=budget_usd,
            prices=prices,
            files=files,
        )
        if plan.snapshot is not None and plan.snapshot.notice():
            print(plan.snapshot.notice())  # the credential files left out
        if plan.warning:
            print(plan.warning)  # a script or command with no hook: a preemption loses it all
        try:
            self._check_capacity(res, state())
            return self._submit(plan, dry_run)
        finally:
            plan.discard()  # the engine wrote the snapshot where the run reads it

    # -- functions, submitit-style (tgnb.runs.call) ----------------------------------------

    def executor(self, **options: Any) -> Executor:
        """submitit's executor on this session: ``.submit(fn, *args, **kwargs)`` and
        ``.map(fn, items)`` launch with `options` (`launch`'s: ``name``, ``gpus_per_node``,
        ``nodes``, ``preemptible``, ``recovery``, ``env``, ``secrets``, ``workdir``...)."""
        from tgnb.runs.call import Executor

        return Executor(self.launch, options, lambda name, runs: self.sweep(name, runs, "map"))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Run:
        """Run ``fn(*args, **kwargs)`` on a node, as submitit's ``executor.submit``: the function
        (a notebook cell's too) and its arguments pickled by value, shipped in the workdir
        snapshot; its `Run`, whose ``result()`` waits and returns the value or raises the
        function's exception with the node's traceback. Something that cannot be sent (a lock, an
        open file, a socket, anything pickle refuses) is a `tgnb.errors.NotPicklableError` and
        nothing is launched. Launch options: `executor`."""
        return self.executor().submit(fn, *args, **kwargs)

    def map(self, fn: Callable[..., Any], /, *iterables: Iterable[Any]) -> Sweep:
        """One run per item, ``fn(item)`` (``fn(a, b)`` over ``zip`` of several iterables), as
        submitit's ``executor.map_array``: the runs, in order, as one sweep (`sweep`)."""
        return cast("Sweep", self.executor().map(fn, *iterables))

    def sweep(
        self, name: str, runs: Iterable[Run] | None = None, source: str = "grid", **how: Any
    ) -> Sweep:
        """Sweep `name` of the run store (`tgnb.runs.sweeps.Sweep`: one table, chart and stop),
        with `runs` added (created on first use; a grid of launches). ``metric=`` (and
        ``mode="min"``) name what its best value is read from."""
        from tgnb.runs.sweeps import Sweep

        ids = [r.id for r in runs or ()]
        if runs is None and not how:
            record = self.store.sweep(name)
        else:
            record = self.store.record_sweep(
                name, ids, cluster_id=self.cluster.id, source=source, **how
            )
        return Sweep(record, self.store, self.run)

    def sweeps(self, all_clusters: bool = False) -> list[Sweep]:
        """The sweeps of this cluster (every one in the store with `all_clusters`), oldest first."""
        from tgnb.runs.sweeps import Sweep

        cid = None if all_clusters else self.cluster.id
        return [Sweep(r, self.store, self.run) for r in self.store.sweeps(cluster_id=cid)]

    def certify(self, what: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
        """Certify a script (or ``command=``) on this local emulator: run it beside an
        uninterrupted copy under preemptions and a kill, and return the `tgnb.certify.Certificate`
        (``.safe``). Options: `tgnb.certify.core.certify`."""
        from tgnb.certify import certify

        return certify(self, what, **kwargs)

    def _submit(self, plan: Any, dry_run: bool) -> Any:
        """Record the plan's run and submit it (`dry_run`: the config as the node runs it)."""
        spec, backend = plan.spec, self.backend
        if self.store.find(spec.name) is not None:
            raise ValidationError(
                f"a run named {spec.name!r} already exists: choose another name= (or "
                "session.run(name))"
            )
        # the engine renders the launch and checks it (commands, controller, image) before
        # the run is recorded; submit sends what it rendered
        prepared = backend.preflight(spec)
        run_dir = backend.run_dir_for(spec.name)
        if dry_run:
            return plan.resolved(None if run_dir is None else os.fspath(run_dir))
        record = self.store.create(
            spec,
            backend=backend.name,
            cluster_id=self.cluster.id,
            run_dir=None if run_dir is None else os.fspath(run_dir),
        )
        try:
            job_id = backend.submit(spec, prepared)
        except TgnbError as exc:
            self.store.set_state(record.id, JobState.FAILED, f"submit failed: {exc}")
            raise
        self.store.add_job(record.id, job_id)  # the one record of the run's job
        if joined := os.environ.get(SWEEP_ENV, "").strip():  # `tgnb notebooks run --sweep`
            self.store.record_sweep(
                joined, [record.id], cluster_id=self.cluster.id, source="notebooks"
            )
        return self._run(self.store.get(record.id))


def attach(
    name_or_id: str | None = None,
    local: bool | None = None,
    *,
    home: str | os.PathLike[str] | None = None,
    create: bool | None = None,
    cluster_type: str = "KUBERNETES",
    time_scale: float | None = None,
    backend: str | Backend | None = None,
    start: bool = True,
    **backend_options: Any,
) -> Session:
    """Attach to a cluster by name or id and return a `Session`.

    Where (the default `tgnb.post_training` shares, `tgnb.connection.wants_local`): with no
    ``TOGETHER_API_KEY`` set, or with `local` True, the local emulator daemon is started (or the
    running one reused, under the tgnb home); with a key, or `local` False, Together. On the
    emulator, with no name, the session attaches to the demo cluster ``tgnb-demo``
    (``tgnb-demo-slurm`` for a SLURM `cluster_type`), created if it does not exist;
    `create=True` creates a missing named cluster there. A daemon started here runs with
    `time_scale` (default 0.02) and is announced once on stdout; a running one is reused when
    `time_scale` is None or matches it (else `EmulatorMismatchError`, unless the current command
    started it: then it is restarted). `start=False` starts nothing: `EmulatorError` when no
    emulator runs.
    """
    from tgnb import connection

    settings = Settings.from_env()
    if home is not None:
        settings = Settings(settings.api_key, settings.project_id, settings.base_url, Path(home))
    on_emulator = connection.wants_local(local, settings)
    end = connection.connect(local, time_scale=time_scale, start=start, settings=settings)
    cloud = end.clusters()

    def session(cluster: Cluster) -> Session:
        return Session(
            cloud,
            cluster,
            backend=backend,
            backend_options=backend_options,
            emulator=end.emulator,
            poll=end.poll,
        )

    if not on_emulator:
        if name_or_id is None:
            states = cloud.clusters()
            if len(states) != 1:
                names = ", ".join(s.name for s in states) or "none"
                raise ValidationError(
                    f"name the cluster to attach to: tgnb.attach('NAME'); clusters: {names}"
                )
            name_or_id = states[0].id
        return session(cloud.attach(name_or_id))
    default = DEMO_CLUSTER if cluster_type.upper() == "KUBERNETES" else f"{DEMO_CLUSTER}-slurm"
    target = name_or_id or default
    try:
        cluster = cloud.attach(target)
    except NotFoundError:
        if not (create or (create is None and name_or_id is None)):
            raise
        cluster = cloud.create(target, cluster_type=cluster_type.upper())
    return session(cluster)


def shutdown_local(home: str | os.PathLike[str] | None = None, timeout: float = 60.0) -> None:
    """Stop what runs on the local emulator of `home`: its unfinished runs (their supervisors are
    detached, so they would outlive the daemon), then the emulator daemon itself."""
    from tgnb import connection

    path = Path(home) if home is not None else Settings.from_env().home
    if not connection.running(path):
        return
    try:
        session = attach(local=True, home=path)
        for run in session.runs(all_clusters=True):
            if not run.state.finished:
                run.stop()
                run.wait(timeout=timeout)
    finally:
        connection.stop(path)
