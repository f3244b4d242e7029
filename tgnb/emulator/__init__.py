"""tgnb.emulator: a Together-compatible clusters API with an emulated preemptible fleet.

Served for real by uvicorn on 127.0.0.1 (the official SDK and the ``tg`` CLI work against it
through ``TOGETHER_BASE_URL=http://127.0.0.1:<port>``, no ``/v1``), run as a daemon
(``tgnb emulator start|stop|status|serve``) whose state persists under ``$TGNB_HOME/emulator``.

- `tgnb.emulator.models`: cluster and node state, the SDK's ``Cluster`` JSON shape;
- `tgnb.emulator.fleet`: the clusters, their clock and persistence, the operations the routes call;
- `tgnb.emulator.lifecycle`: provisioning toward the target, preemption, drain window, the file
  contract for the workload plane (``state/nodes/<node>/preemption-notice.json``, ``removed.json``);
- `tgnb.emulator.capacity`: the capacity caps and the capacity trace in force;
- `tgnb.emulator.app`: the HTTP routes, key check, chaos, request log and admin endpoints;
- `tgnb.emulator.daemon` / `tgnb.emulator.cli`: start, stop, status, serve; `tgnb.emulator.home`:
  the emulator home's files and the process they name; `tgnb.emulator.options`: what a server runs
  with, the mismatch with a running one, what a crashed one had;
- `tgnb.emulator.testing`: `running_emulator(home, **knobs)` for tests.
"""

from tgnb.emulator.daemon import EmulatorStatus, ServeOptions, start, status, stop

__all__ = ["EmulatorStatus", "ServeOptions", "start", "status", "stop"]
