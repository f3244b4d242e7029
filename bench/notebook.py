"""Notebook-surface benchmark: ``%load_ext tgnb``, ``%tg status`` against the raw SDK, timeline render.

    python bench/notebook.py [--rounds 30]

Prints, measured side by side in this one run:
- the time of ``%load_ext tgnb`` in fresh processes (a new IPython `InteractiveShell` each);
- the latency of ``%tg status`` divided by a raw SDK ``clusters.retrieve`` against the same local
  emulator, interleaved call by call (target <= 1.2);
- the time to build and render an `EventTimeline` of 10,000 events to SVG (target < 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

LOAD_EXT = """
import json, time
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
t = time.perf_counter()
shell.run_line_magic("load_ext", "tgnb")
print(json.dumps({"load_ext_s": time.perf_counter() - t}))
"""


def bench_load_ext(rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        proc = subprocess.run(
            [sys.executable, "-c", LOAD_EXT], capture_output=True, text=True, check=True
        )
        out.append(json.loads(proc.stdout.strip().splitlines()[-1])["load_ext_s"])
    return out


def bench_status(rounds: int) -> tuple[list[float], list[float]]:
    import os

    import together
    from IPython.core.interactiveshell import InteractiveShell

    from tgnb.emulator.testing import running_emulator

    with tempfile.TemporaryDirectory() as tmp, running_emulator(Path(tmp)) as emu:
        os.environ.update(emu.env)
        shell: Any = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "tgnb")
        with contextlib.redirect_stdout(io.StringIO()):
            session = shell.run_line_magic("tg", "attach --local")
        cluster_id = session.cluster.id
        client = together.Together(base_url=emu.base_url, api_key=emu.api_key)
        for _ in range(3):  # warm both paths (connections, imports)
            shell.run_line_magic("tg", "status")
            client.clusters.retrieve(cluster_id)
        magic, raw = [], []
        for i in range(rounds):
            order = ("magic", "raw") if i % 2 == 0 else ("raw", "magic")
            for which in order:
                t = time.perf_counter()
                if which == "magic":
                    shell.run_line_magic("tg", "status")
                    magic.append(time.perf_counter() - t)
                else:
                    client.clusters.retrieve(cluster_id)
                    raw.append(time.perf_counter() - t)
        client.close()
        return magic, raw


def ten_thousand_events() -> list[object]:
    from tgnb.events import Event

    rng = random.Random(0)
    t0 = datetime(2026, 11, 29, tzinfo=timezone.utc)
    out: list[object] = []
    for i in range(10_000):
        t = t0 + timedelta(seconds=rng.random() * 86_400)
        if i % 2:
            node = f"gpu-preemptible-dp-{rng.randrange(60)}"
            reason = rng.choice(
                ["TogetherNodeAdded", "TogetherPreemptionNotified", "TogetherPreempted"]
            )
            out.append(Event(t, "cluster", reason, node=node))
        else:
            reason = rng.choice(["CheckpointSaved", "CheckpointSaved", "RunResumed", "RunRequeued"])
            out.append(
                Event(
                    t,
                    "run",
                    reason,
                    run=f"run-{rng.randrange(10)}",
                    node=f"gpu-preemptible-dp-{rng.randrange(60)}",
                )
            )
    return out


def bench_timeline(rounds: int) -> tuple[list[float], int]:
    from tgnb.notebook.timeline import EventTimeline

    events = ten_thousand_events()
    now = datetime(2026, 11, 30, tzinfo=timezone.utc)
    times, size = [], 0
    for _ in range(rounds):
        t = time.perf_counter()
        svg = EventTimeline(events, now=now).to_svg()  # type: ignore[arg-type]
        times.append(time.perf_counter() - t)
        size = len(svg)
    return times, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="interleaved %%tg status / SDK pairs")
    ap.add_argument("--load-rounds", type=int, default=5, help="fresh processes for %%load_ext")
    args = ap.parse_args()
    med = statistics.median

    load = bench_load_ext(args.load_rounds)
    print(
        f"%load_ext tgnb in a fresh shell: median {med(load) * 1000:.1f} ms over {len(load)} processes"
    )

    magic, raw = bench_status(args.rounds)
    ratio = med(magic) / med(raw)
    verdict = "ok" if ratio <= 1.2 else "ABOVE TARGET"
    print(
        f"%tg status {med(magic) * 1000:.2f} ms / SDK clusters.retrieve {med(raw) * 1000:.2f} ms "
        f"(medians of {args.rounds} interleaved pairs) = {ratio:.2f}  [target <= 1.2: {verdict}]"
    )

    render, size = bench_timeline(5)
    verdict = "ok" if med(render) < 1.0 else "ABOVE TARGET"
    print(
        f"EventTimeline of 10,000 events -> SVG ({size / 1024:.0f} KiB): median "
        f"{med(render) * 1000:.0f} ms over {len(render)} renders  [target < 1 s: {verdict}]"
    )


if __name__ == "__main__":
    main()
