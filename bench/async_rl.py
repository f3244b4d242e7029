"""Asynchronous RL against the synchronous loop, steps per minute side by side in one run.

A real emulator daemon (``tgnb emulator``, loopback HTTP) serves the Post-Training API; the loop of
`tgnb.tinker.async_rl` runs through ``tgnb.tinker`` (the SDK's Tinker layer) twice per round,
synchronous (``max_off_policy=0``) and asynchronous (``--max-off-policy``, default 1), in
alternating order so both see the same machine load. Printed per round and as the median: steps
per minute of each (after the first step), async / sync, and the seconds the generator and the
trainer were both busy.

On the emulator the trainer's resource and the sampler's each compute on this machine's CPU
(torch threads per side: ``--threads``, default 1, so each side can hold a core of its own, as
each holds its own GPUs on Post-Training); the ratio is bounded by the cores the two leave idle.

Usage: ``python bench/async_rl.py [--rounds 3] [--steps 12] [--max-off-policy 1] [--max-tokens 4]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def one(tinker: Any, base_model: str, lag: int, ns: argparse.Namespace) -> Any:
    from tgnb.tinker import async_rl

    with tinker.ServiceClient() as service:
        return async_rl.run(
            tinker,
            service,
            base_model,
            steps=ns.steps,
            max_off_policy=lag,
            max_tokens=ns.max_tokens,
            seed=0,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--max-off-policy", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the emulator")
    ns = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(ns.threads)  # the daemon inherits it
    import tgnb.tinker as tinker
    from tgnb.emulator.testing import running_emulator

    ratios, overlaps = [], []
    with (
        tempfile.TemporaryDirectory(prefix="tgnb-bench-async-") as tmp,
        running_emulator(Path(tmp), time_scale=0.01) as emu,
    ):
        os.environ.update(TOGETHER_BASE_URL=emu.base_url, TOGETHER_API_KEY=emu.api_key)
        with tinker.ServiceClient() as service:
            caps = service.get_server_capabilities()
            base_model = str(caps.supported_models[0].model_name)
        for r in range(ns.rounds):
            order = [0, ns.max_off_policy] if r % 2 == 0 else [ns.max_off_policy, 0]
            got = {lag: one(tinker, base_model, lag, ns) for lag in order}
            sync, asyn = got[0], got[ns.max_off_policy]
            ratio = asyn.steps_per_minute / sync.steps_per_minute
            ratios.append(ratio)
            overlaps.append(asyn.overlap_seconds())
            print(
                f"round {r + 1}: sync {sync.steps_per_minute:.1f} steps/min, "
                f"async (max_off_policy={ns.max_off_policy}) {asyn.steps_per_minute:.1f}, "
                f"async / sync {ratio:.2f}; both busy {asyn.overlap_seconds():.1f} s of "
                f"{asyn.seconds:.1f} s (sync: {sync.overlap_seconds():.1f} s)",
                flush=True,
            )
    print(
        f"median of {ns.rounds} rounds: async / sync steps per minute {statistics.median(ratios):.2f} "
        f"(generator and trainer both busy {statistics.median(overlaps):.1f} s a run; "
        f"{ns.steps} steps, {ns.max_tokens} tokens a sample, {ns.threads} torch thread(s))"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
