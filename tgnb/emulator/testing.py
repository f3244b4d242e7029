"""A test harness: a real emulator daemon on a free loopback port, and its admin helpers.

    with running_emulator(tmp_path, time_scale=0.01) as emu:
        client = together.Together(base_url=emu.base_url, api_key=emu.api_key)
        subprocess.run(["tg", "clusters", "list"], env={**os.environ, **emu.env})
        emu.preempt(cluster_id)            # notice now, removal after the (scaled) drain window
        emu.requests()                     # what reached the API (method, path, status, body)
        emu.rl_usage(resource_id)          # Post-Training: GPU-minutes and cost of a resource

`home` is used as the tgnb home: the daemon's files go to ``home/emulator/``. The daemon is
stopped (and waited for) when the block exits.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tgnb.emulator import daemon
from tgnb.emulator.admin import AdminClient
from tgnb.emulator.models import DEFAULT_PROJECT_ID

#: Environment variables the `tg` CLI needs to stay offline and quiet in tests.
QUIET_CLI_ENV = {
    "TOGETHER_DISABLE_VERSION_CHECK": "1",
    "TOGETHER_TELEMETRY_DISABLED": "1",
}


class EmulatorHandle(AdminClient):
    """A running emulator: where it answers, its key (a plain str, for tests) and its admin
    calls (`tgnb.emulator.admin.AdminClient`: health, nodes, preempt, release, chaos, ...)."""

    def __init__(self, home: Path, base_url: str, api_key: str, project_id: str, pid: int) -> None:
        super().__init__(base_url, api_key)
        self.home = home
        self.base_url = base_url  # http://127.0.0.1:PORT, no /v1: what the SDK and tg expect
        self.api_key = api_key
        self.project_id = project_id
        self.pid = pid
        self.state_dir = daemon.emulator_home(home) / "state"

    @property
    def env(self) -> dict[str, str]:
        """Variables that point the SDK and the ``tg`` CLI at this emulator (keeps tg offline)."""
        return {
            "TOGETHER_BASE_URL": self.base_url,
            "TOGETHER_API_KEY": self.api_key,
            "TOGETHER_PROJECT_ID": self.project_id,
            "TGNB_HOME": str(self.home),
            # no stored `tg login` credentials from the real user, no version check or telemetry
            "TOGETHER_CREDENTIALS_PATH": str(self.home / "tg-credentials.json"),
            **QUIET_CLI_ENV,
        }

    @property
    def admin(self) -> EmulatorHandle:
        """The admin helpers (``emu.admin.preempt(...)`` reads as well as ``emu.preempt(...)``)."""
        return self

    def client(self, **kwargs: Any) -> Any:
        """An official SDK client (``together.Together``) pointed at this emulator."""
        import together

        kwargs.setdefault("base_url", self.base_url)
        kwargs.setdefault("api_key", self.api_key)
        return together.Together(**kwargs)


@contextlib.contextmanager
def running_emulator(
    home: Path,
    *,
    time_scale: float = 0.01,
    api_key: str | None = None,
    project_id: str = DEFAULT_PROJECT_ID,
    **knobs: Any,
) -> Iterator[EmulatorHandle]:
    """Start a real emulator daemon for `home` on a free port; stop it on exit.

    `knobs` are the flat names of `tgnb.emulator.daemon.ServeOptions.of`: drain_window_s, provision_delay_s,
    preemption_rate, seed, capacity_gpus, chaos, chaos_seed, chaos_delay_s, port,
    rl_price_per_gpu_hour, rl_models, rl_idle_scale, capacity_trace (a file; or `set_capacity_trace`
    once it runs).
    """
    home = Path(home)
    key = api_key or "tgnb-test-" + secrets.token_hex(8)
    options = daemon.ServeOptions.of(time_scale=time_scale, project_id=project_id, **knobs)
    st, _ = daemon.start(home, options, key)
    if not (st.base_url and st.pid and st.api_key):
        raise RuntimeError(f"emulator for {home} did not report where it runs")
    handle = EmulatorHandle(home, st.base_url, st.api_key.get(), project_id, st.pid)
    try:
        yield handle
    finally:
        handle.close()
        daemon.stop(home)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["QUIET_CLI_ENV", "EmulatorHandle", "free_port", "running_emulator"]


def unloadable_model(root: Path) -> str:
    """A model directory under `root` that the emulator's catalogue accepts (the built-in model's
    config and tokenizer) but whose weights cannot be read: a resource on it goes to ERROR."""
    import shutil

    from tgnb.tasks.assets import tiny_path

    broken = Path(root) / "unloadable-model"
    broken.mkdir(parents=True)
    for f in tiny_path().iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, broken / f.name)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    return str(broken)
