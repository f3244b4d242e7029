"""The options an emulator server runs with, and how they carry over.

`ServeOptions` (the port, the fleet's `FleetConfig`, chaos, the Post-Training knobs), the range of
each numeric one (`OPTION_RANGES`, `check_options`, refused before anything starts), what a running
daemon recorded that differs from what is asked (`differences`: the mismatch `start` reports or
restarts over), and what a crashed daemon ran with (`after_crash`: a restart comes back with it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tgnb.emulator.fleet import FleetConfig
from tgnb.emulator.home import EmulatorStatus, alive, port_free, read_server
from tgnb.emulator.models import DEFAULT_PROJECT_ID
from tgnb.errors import ValidationError

#: How `differences` names the options a running emulator was asked for, with the fix's flag.
_LABELS = {
    "time_scale": "time scale",
    "drain_window_s": "drain window",
    "provision_delay_s": "provision delay",
    "preemption_rate": "preemption rate",
    "seed": "seed",
    "capacity_gpus": "capacity",
    "capacity_trace": "capacity trace",
    "chaos": "chaos",
    "chaos_seed": "chaos seed",
    "chaos_delay_s": "chaos delay",
    "project_id": "project",
    "rl_idle_scale": "Post-Training idle scale",
    "port": "port",
}


#: The `FleetConfig` knobs a daemon takes on its command line, by their flat names.
FLEET_KNOBS = (
    "time_scale",
    "drain_window_s",
    "provision_delay_s",
    "preemption_rate",
    "seed",
    "capacity_gpus",
)

_NOT_FLAT = ("port", "fleet")  # port comes first in the flat view; the fleet is spread out

#: The range of each numeric option (flat name -> (low, high), both included). A time scale under
#: 0.001 prunes every lifecycle event at once (retention 72 h x scale); chaos is a fraction.
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "port": (0, 65535),
    "time_scale": (0.001, 1000.0),
    "drain_window_s": (0.0, 86400.0),
    "provision_delay_s": (0.0, 86400.0),
    "preemption_rate": (0.0, 3600.0),
    "seed": (-(2**63), 2**63 - 1),
    "capacity_gpus": (0, 1_000_000),
    "chaos": (0.0, 1.0),
    "chaos_seed": (-(2**63), 2**63 - 1),
    "chaos_delay_s": (0.0, 3600.0),
    "rl_price_per_gpu_hour": (0.0, 1_000_000.0),
    "rl_idle_scale": (0.001, 1.0),
}


def check_options(flat: dict[str, Any]) -> None:
    """Refuse an option out of `OPTION_RANGES` (or not finite) with a one-line
    `ValidationError` naming the flag and its range; None (not given) passes."""
    for name, (lo, hi) in OPTION_RANGES.items():
        value = flat.get(name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-").removesuffix("-gpus")
        integral = isinstance(lo, int) and isinstance(hi, int)
        kind = "an integer" if integral else "a number"
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and (isinstance(value, int) or not integral) and math.isfinite(value)
        if not ok or not lo <= value <= hi:
            raise ValidationError(
                f"{flag} must be {kind} in [{_shown(lo)}, {_shown(hi)}], got {value!r}"
            )


@dataclass
class ServeOptions:
    """One emulator server: its port, its fleet's `FleetConfig` (durations in platform seconds,
    scaled by ``time_scale``; ``default_project_id`` the project), chaos and the Post-Training
    knobs. `ServeOptions.of` takes the flat names of the command line (``time_scale=0.02``,
    ``project_id=...``); `flat` gives them back, as ``server.json`` records them."""

    port: int = 0  # 0: a free port
    fleet: FleetConfig = field(default_factory=FleetConfig)
    chaos: float = 0.0
    chaos_seed: int = 0
    chaos_delay_s: float = 65.0
    rl_price_per_gpu_hour: float | None = None  # None: $TGNB_EMULATOR_RL_PRICE, else 9.0
    rl_models: str | None = None  # extra local model dirs for /v1/rl (os.pathsep-separated)
    rl_idle_scale: float = 1.0  # real seconds per second of a resource's inactive_timeout (tests)
    capacity_trace: str | None = None  # a capacity trace file, JSON or YAML (`tgnb.emulator.trace`)

    @classmethod
    def of(cls, **flat: Any) -> ServeOptions:
        """From flat names: `FLEET_KNOBS` and ``project_id`` (None: the default project) go into
        the `FleetConfig`, the rest are this class's own fields."""
        knobs = {name: flat.pop(name) for name in FLEET_KNOBS if name in flat}
        project = flat.pop("project_id", None)
        if project is not None:
            knobs["default_project_id"] = project
        return cls(fleet=FleetConfig(**knobs), **flat)

    def flat(self) -> dict[str, Any]:
        """Every option by its flat name; ``project_id`` is None for the default project."""
        project = self.fleet.default_project_id
        out: dict[str, Any] = {"port": self.port}
        out.update({name: getattr(self.fleet, name) for name in FLEET_KNOBS})
        out["project_id"] = None if project == DEFAULT_PROJECT_ID else project
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_FLAT})
        return out

    def check(self) -> ServeOptions:
        """`check_options` on these options, and the capacity trace file read and checked; self."""
        check_options(self.flat())
        self.trace()
        return self

    def trace(self) -> Any:
        """The `CapacityTrace` of `capacity_trace` (None: no file); `ValidationError` naming
        the file and the fix when it cannot be read or is not a valid trace."""
        from tgnb.emulator.trace import load_file

        if self.capacity_trace is None:
            return None
        try:
            return load_file(self.capacity_trace)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def to_argv(self) -> list[str]:
        argv = []
        for name, value in self.flat().items():
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        return argv


def differences(
    running: EmulatorStatus, asked: ServeOptions, fields_asked: Iterable[str] | None = None
) -> list[str]:
    """What `running` does not match of `asked` (only `fields_asked`, by default every option but
    a port of 0), as ``"time scale 1 (asked 0.02)"``; empty when it matches or recorded nothing."""
    have = running.options
    if have is None:
        return []
    wanted = asked.flat()
    names = list(fields_asked) if fields_asked is not None else list(wanted)
    out = []
    for name in names:
        want = wanted[name]
        if want is None or (name == "port" and not want):  # not asked: whatever runs will do
            continue
        if name == "port":
            got: Any = running.port
        elif name in have:
            got = have[name]
        else:
            continue
        if got != want:
            label = _LABELS.get(name, name)
            out.append(f"{label} {_shown(got)} (asked {_shown(want)})")
    return out


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def after_crash(eh: Path, options: ServeOptions, asked: Iterable[str] | None) -> ServeOptions:
    """`options` completed with what the crashed daemon of `eh` ran with: the recorded value of
    every option not in `asked` (None: all were asked), and the recorded port when no port is asked
    (0) and it is free. Unchanged when no daemon crashed there (a clean stop removes its record).
    The record is input like a command line: a recorded value out of its range (`check_options`)
    is not restored, and options that do not make a valid whole are not either (start as asked)."""
    info = read_server(eh)  # a checked record, or None
    had = (info or {}).get("options")
    if info is None or not isinstance(had, dict) or alive(info["pid"]):
        return options
    flat = options.flat()
    given = set(flat) if asked is None else set(asked)
    for name, value in had.items():
        if name in flat and name != "port" and name not in given and _in_range(name, value):
            flat[name] = value
    if not flat["port"] and port_free(info["port"]):
        flat["port"] = info["port"]
    try:
        return ServeOptions.of(**flat).check()
    except (TypeError, ValueError):  # a record from another version, or refused: as asked
        return options


def _in_range(name: str, value: Any) -> bool:
    try:
        check_options({name: value})
    except ValidationError:
        return False
    return True
