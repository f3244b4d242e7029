"""Where the platform answers: the Together API, or the local emulator, its peer on loopback.

The one module of the product that starts, finds or talks to the emulator (`tgnb.emulator`); the
local backend, which runs processes on its nodes, is the other seam (tests/test_architecture.py
keeps it so). Everything above gets an `Endpoint`: the API root, its key, how often to poll, and
`emulator` — the emulator-only operations (preempt a node, the usage report, the time scale,
shutdown) — which is None on the real service. Nothing else asks "am I local?". An `Endpoint` also
gives the SDK its keywords (`Endpoint.native`), a plain client (`Endpoint.sdk`), the clusters API
(`Endpoint.clusters`: a `tgnb.cloud.Cloud`), and one translation of SDK failures into
`tgnb.errors` (`Endpoint.call`, `fail`: `tgnb.cloud.client.translate`, which the clusters plane
uses too). Every SDK client of every plane is made by `tgnb.cloud.client.make_client`, with the
endpoint's project.

One default for `tgnb.attach` and `tgnb.post_training` (`wants_local`): ``local=None`` means the
local emulator when no ``TOGETHER_API_KEY`` is set and Together when one is; ``True`` always the
emulator (started, or the running one of the tgnb home reused); ``False`` always Together
(`ConfigError` without a key).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tgnb.cloud.client import is_sdk_error, make_client, raise_translated
from tgnb.config import DEFAULT_TIME_SCALE, Secret, Settings
from tgnb.errors import ConfigError, EmulatorError, TgnbError, ValidationError

if TYPE_CHECKING:
    from together import Together

    from tgnb.cloud import Cloud

T = TypeVar("T")

#: Seconds between status polls (capacity, a resource coming up): the emulator on loopback
#: answers at once; the service is asked every 10 s.
LOCAL_POLL = 0.25
REMOTE_POLL = 10.0


def wants_local(local: bool | None, settings: Settings) -> bool:
    """The shared default: `local` if given, else the emulator exactly when no key is set."""
    return settings.api_key is None if local is None else bool(local)


class Emulator:
    """The emulator-only operations of a local `Endpoint` (its admin routes and its daemon)."""

    def __init__(self, base_url: str, api_key: Secret | str | None, home: Path) -> None:
        self.base_url = base_url
        self._key = api_key.get() if isinstance(api_key, Secret) else api_key
        self.home = home

    def __repr__(self) -> str:
        return f"<Emulator at {self.base_url}>"

    def _admin(self, timeout: float = 30.0) -> Any:
        from tgnb.emulator.admin import AdminClient

        return AdminClient(self.base_url, self._key, timeout)

    def preempt(self, cluster_id: str, node: str | None = None) -> dict[str, Any]:
        """Preempt `node` (default: the oldest running preemptible one) of `cluster_id` now: the
        node's view. A refusal is a `ValidationError` with the emulator's own message."""
        import httpx

        with self._admin() as admin:
            try:
                return dict(admin.preempt(cluster_id, node))
            except httpx.HTTPStatusError as exc:
                try:
                    message = str(exc.response.json().get("message") or "")
                except (ValueError, AttributeError):
                    message = ""
                raise ValidationError(
                    message or f"the emulator answered {exc.response.status_code}"
                ) from None

    def set_capacity(self, cluster_id: str, gpus: int | None) -> None:
        """Cap the preemptible GPUs of `cluster_id` (live and provisioning): no replacement or new
        node beyond it; None lifts the cap. Nodes already up stay."""
        with self._admin() as admin:
            admin.set_capacity(gpus, cluster_id)

    def usage(self, resource_id: str) -> dict[str, Any] | None:
        """A Post-Training resource's usage report (READY/STOPPED times, GPUs, GPU-minutes)."""
        import httpx

        try:
            with self._admin() as admin:
                body: Any = admin.rl_usage(resource_id)
        except httpx.HTTPError:
            return None
        return body if isinstance(body, dict) else None

    def time_scale(self) -> float | None:
        """How much faster than real time the platform's time runs (None: no answer)."""
        import httpx

        try:
            with self._admin(5.0) as admin:
                return float(admin.health()["time_scale"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def shutdown(self) -> bool:
        """Stop the emulator daemon (what runs on it first: `tgnb.session.shutdown_local`)."""
        return stop(self.home)


@dataclass(frozen=True)
class Endpoint:
    """Where the platform answers: the API root (None: the SDK's default), its key, the
    project, the tgnb home, how often to poll, and the emulator's own operations (None on the
    service)."""

    base_url: str | None
    api_key: Secret | None
    project_id: str | None
    home: Path
    poll: float
    emulator: Emulator | None = None

    @property
    def where(self) -> str:
        """``the local emulator`` or ``Together``, for messages and reprs."""
        return "the local emulator" if self.emulator is not None else "Together"

    @property
    def settings(self) -> Settings:
        """The endpoint as `tgnb.config.Settings` (key, project, API root, home)."""
        return Settings(self.api_key, self.project_id, self.base_url, self.home)

    def clusters(self, **options: Any) -> Cloud:
        """The clusters API at this endpoint (`options`: `tgnb.cloud.Cloud`'s ``timeout``,
        ``max_retries``, ``retry``)."""
        from tgnb.cloud import Cloud

        return Cloud(self.settings, **options)

    def native(self) -> dict[str, Any]:
        """The ``api_key=`` / ``base_url=`` keywords of the SDK's native clients."""
        return {"api_key": self.api_key.get() if self.api_key else None, "base_url": self.base_url}

    def fresh(self) -> Endpoint:
        """The same endpoint with clients of its own, for a signal's handler: the thread it
        interrupted may hold the lock of this endpoint's HTTP connection pool (httpcore's is not
        reentrant), and a request through that pool would then wait forever."""
        return replace(self)

    def sdk(self) -> Together:
        """A plain ``together.Together`` client, made once per endpoint (lists, checkpoints,
        estimate-cost, download); 5 SDK retries on 408/409/429/5xx, as reads are safe to repeat."""
        return self._sdk

    @functools.cached_property
    def _sdk(self) -> Together:
        return make_client(self.settings, timeout=60.0, max_retries=5)

    def call(self, fn: Callable[[], T], what: str) -> T:
        """Run an SDK call; any SDK failure becomes a `tgnb.errors` exception about `what`."""
        try:
            return fn()
        except TgnbError:
            raise
        except Exception as exc:
            fail(exc, what, self.base_url)


#: What a 404 of the Post-Training plane tells to look at.
PT_LISTS = "pt.resources() / res.sessions() / res.checkpoints() list what exists"


def fail(exc: BaseException, what: str, base_url: str | None = None) -> NoReturn:
    """Raise the `tgnb.errors` exception for `exc` (an SDK or SDK-client failure): the one
    translation, `tgnb.cloud.client.translate`; anything else is raised as it is."""
    if is_sdk_error(exc) or isinstance(exc, (RuntimeError, TimeoutError, ValueError)):
        raise_translated(exc, what, base_url, PT_LISTS)
    raise exc


def connect(
    local: bool | None = None,
    *,
    home: str | Path | None = None,
    time_scale: float | None = None,
    start: bool = True,
    settings: Settings | None = None,
) -> Endpoint:
    """The `Endpoint` for `local` (the shared default: `wants_local`).

    Together: ``TOGETHER_API_KEY`` / ``TOGETHER_BASE_URL`` / ``TOGETHER_PROJECT_ID`` as the SDK
    reads them (`ConfigError` without a key). The emulator: the daemon of the tgnb home, started
    if none runs (`start` False: `EmulatorError` instead) with `time_scale` (default 0.02) and
    announced once on stdout; a running one is reused when `time_scale` is None or matches it
    (else `EmulatorMismatchError`, unless the current command started it: then it is restarted).
    """
    settings = settings or Settings.from_env()
    if home is not None:
        settings = Settings(
            settings.api_key, settings.project_id, settings.base_url, Path(home).expanduser()
        )
    if not wants_local(local, settings):
        if not settings.api_key:
            raise ConfigError(
                "no TOGETHER_API_KEY is set: export it, or use the local emulator (local=True)"
            )
        return _remote(settings, _home_emulator_at(settings) if local is None else None)
    return _local(settings, time_scale, start)


#: What a script (the Tinker layer) is told when it has no key: it cannot start the emulator
#: itself (nothing is started behind a script's back), so it names the commands that do.
NO_KEY_FOR_A_SCRIPT = (
    "no TOGETHER_API_KEY is set: export your Together API key, or run on the local emulator: "
    "`tgnb emulator start`, then the two export lines it prints"
)


def of_sdk_keywords(api_key: str | None = None, base_url: str | None = None) -> Endpoint:
    """The `Endpoint` of the SDK's own ``api_key=`` / ``base_url=`` keywords (the Tinker layer's
    ``ServiceClient``): None reads ``TOGETHER_API_KEY`` / ``TOGETHER_BASE_URL`` as the SDK does.
    Nothing is started or asked; no key at all is a `ConfigError` naming both ways to get one
    (Tinker refuses a client without a key when it is made, not at its first call)."""
    settings = Settings.from_env()
    settings = replace(
        settings,
        api_key=Secret(api_key) if api_key else settings.api_key,
        base_url=settings.base_url if base_url is None else base_url,
    )
    if settings.api_key is None:
        raise ConfigError(NO_KEY_FOR_A_SCRIPT)
    return _remote(settings, None)


def with_home_emulator(end: Endpoint) -> Endpoint:
    """`end` with its emulator's own operations when its API root is the tgnb home's running
    emulator (a Tinker script's endpoint comes from the SDK's keywords, `of_sdk_keywords`, which
    asks nothing): its usage report is the bill a cost must agree with. Else `end` as it is."""
    if end.emulator is not None:
        return end
    settings = Settings(api_key=end.api_key, base_url=end.base_url, home=end.home)
    found = _home_emulator_at(settings)
    return end if found is None else replace(end, emulator=found)


def _remote(settings: Settings, emulator: Emulator | None) -> Endpoint:
    return Endpoint(
        settings.base_url,
        settings.api_key,
        settings.project_id,
        settings.home,
        REMOTE_POLL if emulator is None else LOCAL_POLL,
        emulator,
    )


def _home_emulator_at(settings: Settings) -> Emulator | None:
    """The home's emulator when ``TOGETHER_BASE_URL`` names it (as `tgnb emulator start` tells a
    shell to export) and nothing was asked (``local=False`` says: treat it as the service): the key
    then picked the emulator by its URL, and its own operations apply."""
    url = (settings.base_url or "").rstrip("/")
    if not url.startswith(("http://127.0.0.1:", "http://localhost:", "http://[::1]:")):
        return None
    from tgnb.emulator import daemon

    st = daemon.status(settings.home)
    if not (st.running and st.base_url and st.api_key) or st.base_url.rstrip("/") != url:
        return None
    return Emulator(st.base_url, st.api_key, settings.home)


def _local(settings: Settings, time_scale: float | None, start: bool) -> Endpoint:
    from tgnb.emulator import daemon
    from tgnb.emulator.models import DEFAULT_PROJECT_ID

    st = daemon.status(settings.home)
    if not start and not st.running:
        raise EmulatorError(
            f"no local emulator runs for {st.home}: start it with `tgnb emulator start` "
            "(or attach from a notebook: `%tg attach --local`)"
        )
    if time_scale is not None or not st.running:
        was = st.running
        asked = daemon.ServeOptions.of(
            time_scale=DEFAULT_TIME_SCALE if time_scale is None else time_scale
        )
        st, started = daemon.start(
            settings.home, asked, asked=["time_scale"] if time_scale is not None else []
        )
        if started:
            print(
                f"{'restarted' if was else 'started'} the local emulator on {st.base_url} "
                f"(time scale {(st.options or {}).get('time_scale', asked.fleet.time_scale):g}); "
                "`tgnb emulator stop` stops it"
            )
    if not (st.base_url and st.api_key):
        raise ConfigError(f"the local emulator under {st.home} did not say where it answers")
    return Endpoint(
        st.base_url,
        st.api_key,
        settings.project_id or DEFAULT_PROJECT_ID,
        settings.home,
        LOCAL_POLL,
        Emulator(st.base_url, st.api_key, settings.home),
    )


def _home(home: str | Path | None) -> Path | None:
    return Path(home).expanduser() if home is not None else None


@dataclass(frozen=True)
class Running:
    """A local emulator that runs: where it answers, and the ``$TGNB_EMULATOR_OWNER`` of the
    command that started it (None: started by hand)."""

    base_url: str | None
    owner: str | None


def find(home: str | Path | None = None) -> Running | None:
    """The local emulator of `home` (default: the tgnb home) if it runs, else None."""
    from tgnb.emulator import daemon

    st = daemon.status(_home(home))
    return Running(st.base_url, st.owner) if st.running else None


def running(home: str | Path | None = None) -> bool:
    """Whether the local emulator of `home` (default: the tgnb home) runs."""
    return find(home) is not None


def stop(home: str | Path | None = None) -> bool:
    """Stop the local emulator daemon of `home`; whether one was running."""
    from tgnb.emulator import daemon

    return daemon.stop(_home(home))


__all__ = [
    "DEFAULT_TIME_SCALE",
    "Emulator",
    "Endpoint",
    "Running",
    "connect",
    "fail",
    "find",
    "running",
    "stop",
    "wants_local",
    "with_home_emulator",
]
