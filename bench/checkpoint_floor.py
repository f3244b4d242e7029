"""The least an atomic checkpoint can cost here, against a plain write + fsync of the same bytes.

A checkpoint counts once its completion marker is written *after* its data is durable, so it
needs two flushes in order (the data, then the marker), where a plain write needs one. This times,
side by side in random order, with no Python work beyond the system calls:

- ``plain``: create a file, write N bytes, fsync it and its directory (bench/checkpoint.py's
  baseline);
- ``one_file``: mkdir, one data file of N bytes (write, fsync), then the marker (write, fsync),
  then fsync the directory and its parent -- the floor of any marker-after-fsync protocol;
- ``trainer_layout``: the five files of a Trainer checkpoint (weights, optimizer, scheduler, RNG,
  trainer state; N bytes in all, split like the tiny model's), fsynced in parallel, then the
  marker through a temporary name and a rename.

For the tiny model's 1.1 MB the flushes dominate: a checkpoint in new files costs at least
``one_file / plain``. For large checkpoints all tend to 1.

Usage: ``python bench/checkpoint_floor.py [--bytes 1100000] [--rounds 40] [--dir DIR]``
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tgnb.train.checkpoint import fsync_path

#: How the tiny model's checkpoint splits its bytes over the Trainer's five files.
SHARES = (0.27, 0.66, 0.014, 0.0014, 0.0546)


def write_file(path: Path, data: bytes | memoryview) -> None:
    with open(path, "wb", buffering=0) as fh:
        fh.write(data)
        os.fsync(fh.fileno())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=1_100_000)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--dir", help="where to write (default: a temporary directory)")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="tgnb-floor-", dir=args.dir))
    data = memoryview(os.urandom(args.bytes))
    marker = b"{" + b" " * 3000 + b"}"
    pool = ThreadPoolExecutor(len(SHARES))
    count = 0

    def fresh() -> Path:
        nonlocal count
        count += 1
        return root / f"c{count}"

    def plain() -> None:
        write_file(fresh(), data)
        fsync_path(root)

    def one_file() -> None:
        d = fresh()
        d.mkdir()
        write_file(d / "data", data)
        write_file(d / "marker", marker)
        fsync_path(d)
        fsync_path(root)

    def trainer_layout() -> None:
        d = fresh()
        d.mkdir()
        cuts = [0]
        for share in SHARES:
            cuts.append(min(len(data), cuts[-1] + round(share * len(data))))
        parts = [data[a:b] for a, b in itertools.pairwise(cuts)]
        list(pool.map(lambda i: write_file(d / f"f{i}", parts[i]), range(len(parts))))
        fsync_path(d)
        write_file(d / ".marker.tmp", marker)
        os.replace(d / ".marker.tmp", d / "marker")
        fsync_path(d)
        fsync_path(root)

    sides = {"plain": plain, "one_file": one_file, "trainer_layout": trainer_layout}
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            began = time.perf_counter()
            took = sides[name]()  # None, or the time of the part that counts
            times[name].append(time.perf_counter() - began if took is None else took)
    pool.shutdown()
    shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["plain"])
    print(f"{args.bytes} bytes, {args.rounds} rounds in random order; medians:")
    for name, got in times.items():
        med = statistics.median(got)
        print(f"  {name:>14}: {med * 1e3:8.3f} ms   ratio to plain {med / base:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
