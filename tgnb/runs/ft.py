"""THE contract of a run launched with ``fault_tolerance="torchft"`` (issue 50): what every engine
(local, Slurm, Kubernetes) gives it, so each renders the same names and values.

A fault-tolerant run is N *replica groups*, one per node (a group is that node's processes: one
torchrun, DDP or FSDP inside it, its own rendezvous and store), under one TorchFT *lighthouse*: the
run's coordinator, started on a standard node (locally: beside the emulator's fleet), never on a
preemptible one. A preemption removes one group, not the run; a replacement group joins by healing
from a live peer (TorchFT's live weight transfer), with no checkpoint load.

- The lighthouse runs `lighthouse_command` (TorchFT's ``torchft_lighthouse``), bound to
  `LIGHTHOUSE_PORT` on its host unless an engine picks another port.
- Every process of group ``i`` of ``N`` gets `group_env` (TorchFT's own names, as its examples
  read them): `LIGHTHOUSE_ENV` (the lighthouse's URL), `REPLICA_GROUP_ENV` (``i``),
  `NUM_GROUPS_ENV` (``N``), plus TorchFT's Manager timeouts (`TIMEOUT_ENV`, `QUORUM_TIMEOUT_ENV`,
  `CONNECT_TIMEOUT_ENV`: the Manager reads them before its own arguments).
- The survivors' wait when a group vanishes (the *quorum timeout* a user sees) is the lighthouse's
  heartbeat timeout, `LighthouseOptions.heartbeat_timeout_ms`: a group that stops heartbeating
  (killed, or left on a notice) is out of the quorum after it; the survivors then go on alone. A
  run sets it (and the join timeout) through its ``env`` with `HEARTBEAT_TIMEOUT_ENV` and
  `JOIN_TIMEOUT_ENV` (`lighthouse_options` reads them; a bad value is a `ValueError` naming the fix).
- Periodic checkpoints are written by one group only: `CHECKPOINT_GROUP` (the lowest group alive
  takes over; `tgnb.train`'s fault-tolerant Checkpointer decides it from the quorum).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: The engine's name for this mode (``TrainConfig.fault_tolerance``).
TORCHFT = "torchft"

#: The lighthouse's URL, ``http://HOST:PORT`` (TorchFT's Manager reads it).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
#: This group's index, 0..N-1 (a replacement group takes the index of the group it replaces).
REPLICA_GROUP_ENV = "REPLICA_GROUP_ID"
#: N, the run's groups (nodes) as launched.
NUM_GROUPS_ENV = "NUM_REPLICA_GROUPS"
#: TorchFT's Manager timeouts, whole seconds (``torchft.manager``'s names).
TIMEOUT_ENV = "TORCHFT_TIMEOUT_SEC"
QUORUM_TIMEOUT_ENV = "TORCHFT_QUORUM_TIMEOUT_SEC"
CONNECT_TIMEOUT_ENV = "TORCHFT_CONNECT_TIMEOUT_SEC"
#: A run's ``env`` may set these to tune the lighthouse (milliseconds).
HEARTBEAT_TIMEOUT_ENV = "TGNB_FT_HEARTBEAT_TIMEOUT_MS"
JOIN_TIMEOUT_ENV = "TGNB_FT_JOIN_TIMEOUT_MS"

#: TorchFT's default lighthouse port.
LIGHTHOUSE_PORT = 29510
#: The group that writes the periodic checkpoints while it is alive.
CHECKPOINT_GROUP = 0

#: Manager timeouts (s): a collective with a dead peer, a quorum, a connection.
TIMEOUT_S = 30
QUORUM_TIMEOUT_S = 120
CONNECT_TIMEOUT_S = 30


@dataclass(frozen=True)
class LighthouseOptions:
    """The lighthouse's settings. `heartbeat_timeout_ms` is the survivors' wait when a group
    vanishes (TorchFT's default is 5000; tgnb's 2000 keeps a preemption's stall short while a
    loaded machine's heartbeats, every 100 ms, still arrive); `join_timeout_ms` how long a quorum
    waits for a heartbeating group that has not asked to join yet."""

    min_replicas: int = 1
    quorum_tick_ms: int = 100
    join_timeout_ms: int = 1000
    heartbeat_timeout_ms: int = 2000


def lighthouse_options(env: Mapping[str, object] | None = None) -> LighthouseOptions:
    """The lighthouse's options, with a run's `env` overrides (`HEARTBEAT_TIMEOUT_ENV`,
    `JOIN_TIMEOUT_ENV`)."""
    env = env or {}
    values: dict[str, int] = {}
    for var, key in (
        (HEARTBEAT_TIMEOUT_ENV, "heartbeat_timeout_ms"),
        (JOIN_TIMEOUT_ENV, "join_timeout_ms"),
    ):
        raw = env.get(var)
        if raw is None:
            continue
        try:
            values[key] = int(str(raw))
        except ValueError:
            values[key] = -1
        if values[key] <= 0:
            raise ValueError(f"{var} must be a positive number of milliseconds: e.g. {var}=2000")
    return LighthouseOptions(**values)


def lighthouse_command(
    bind: str, options: LighthouseOptions | None = None, program: str = "torchft_lighthouse"
) -> list[str]:
    """The lighthouse's command line (TorchFT's ``torchft_lighthouse``), bound to `bind`
    (``HOST:PORT``; ``[::]:29510`` on a cluster)."""
    o = options or LighthouseOptions()
    return [
        program,
        "--min_replicas",
        str(o.min_replicas),
        "--quorum_tick_ms",
        str(o.quorum_tick_ms),
        "--join_timeout_ms",
        str(o.join_timeout_ms),
        "--heartbeat_timeout_ms",
        str(o.heartbeat_timeout_ms),
        "--bind",
        bind,
    ]


def lighthouse_url(host: str, port: int = LIGHTHOUSE_PORT) -> str:
    """The URL groups reach the lighthouse at (the value of `LIGHTHOUSE_ENV`)."""
    return f"http://{host}:{port}"


def group_env(lighthouse: str, group: int, groups: int) -> dict[str, str]:
    """What every process of group `group` (0-based) of `groups` gets, beside the node's own
    environment (`tgnb.runs.node`): the lighthouse's URL, its index, the group count and the
    Manager's timeouts."""
    if not 0 <= group < groups:
        raise ValueError(f"replica group {group} is outside 0..{groups - 1}")
    return {
        LIGHTHOUSE_ENV: lighthouse,
        REPLICA_GROUP_ENV: str(group),
        NUM_GROUPS_ENV: str(groups),
        TIMEOUT_ENV: str(TIMEOUT_S),
        QUORUM_TIMEOUT_ENV: str(QUORUM_TIMEOUT_S),
        CONNECT_TIMEOUT_ENV: str(CONNECT_TIMEOUT_S),
    }
