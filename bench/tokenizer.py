"""The first tokenizer load of a process, by the name the Post-Training emulator lists, beside the same
load of a plain local Llama directory (what any local model pays), in fresh processes, alternated.

    python bench/tokenizer.py [--rounds 5]

Issue 23: the tokenizer of a served model loads by the name ``/v1/rl/supported-models`` lists, in
under 3 s, with no network and no environment variable. Each round starts two fresh interpreters
with every ``HF_*``/``TRANSFORMERS_*`` variable unset, imports transformers (not timed: that is the
import of the library, not the load), then times ``AutoTokenizer.from_pretrained(name)`` once
(the first load of the process: transformers imports its model-config modules then) and again.
``listed`` is the name the emulator's catalogue lists (`tgnb.emulator.rl.catalog.supported_models`,
what the route serves); ``plain`` is a local directory holding a ``LlamaConfig`` and the same
tokenizer files, written by ``save_pretrained``. Printed: medians and the ratio listed / plain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOAD = """
import json, sys, time
from transformers import AutoTokenizer
t0 = time.monotonic()
AutoTokenizer.from_pretrained(sys.argv[1])
t1 = time.monotonic()
AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps({"first_s": t1 - t0, "again_s": time.monotonic() - t1}))
"""


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}


def load(name: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", LOAD, name],
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def plain_llama(listed: Path, into: Path) -> Path:
    """A local Llama directory: the listed model's config re-saved by ``LlamaConfig`` and its
    tokenizer files, without tgnb's cache layout."""
    from transformers import AutoTokenizer, LlamaConfig

    LlamaConfig.from_pretrained(listed).save_pretrained(into)
    AutoTokenizer.from_pretrained(listed).save_pretrained(into)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from tgnb.emulator.rl.catalog import supported_models

    listed = supported_models()[0].name
    with tempfile.TemporaryDirectory() as tmp:
        plain = str(plain_llama(Path(listed), Path(tmp) / "llama"))
        rows: dict[str, list[dict[str, float]]] = {"listed": [], "plain": []}
        for i in range(args.rounds):
            order = ("listed", "plain") if i % 2 == 0 else ("plain", "listed")
            for which in order:
                rows[which].append(load(listed if which == "listed" else plain))
    med = {
        k: {m: statistics.median(r[m] for r in v) for m in ("first_s", "again_s")}
        for k, v in rows.items()
    }
    print(f"listed name: {listed}")
    for k in ("listed", "plain"):
        firsts = ", ".join(f"{r['first_s']:.2f}" for r in rows[k])
        print(
            f"{k:6s} first load median {med[k]['first_s']:.2f} s ({firsts}); "
            f"again {med[k]['again_s'] * 1000:.1f} ms"
        )
    ratio = med["listed"]["first_s"] / med["plain"]["first_s"]
    print(f"ratio listed / plain (first load): {ratio:.2f}; target: listed under 3 s")


if __name__ == "__main__":
    main()
