"""Asynchronous RL against the synchronous loop: steps per minute, async / sync, median of N rounds.

A real emulator daemon (``tgnb emulator``, loopback HTTP) serves the Post-Training API; the loop of
`tgnb.tinker.async_rl` runs through ``tgnb.tinker`` twice per round, synchronous
(``max_off_policy=0``) and asynchronous (``--max-off-policy``, default 1), in alternating order so
both see the same machine load. Each round prints the 1-minute load average beside it.

Two figures per round:

- **modelled (the service's regime)**: on Post-Training the trainer's resource and the
  sampler's are separate GPUs. The emulator computes both on this machine's shared CPU cores,
  which cannot show that regime, so it is modelled (`tgnb.tinker.async_rl.modelled_seconds`):
  each piece of the round's synchronous run (a batch of rollouts, the rewards, a step's training,
  saving a version's sampler weights, opening its sampler), measured while it ran alone, counts as
  that piece's GPU time on its own resource, and the loop is scheduled with 0 and with
  ``max_off_policy`` versions of lag on two GPUs (the sampler's one batch at a time). Its ``fit``
  checks the model against the emulator: each run's pace modelled from its own pieces over its
  measured pace, synchronous / asynchronous (1.00: the model replays the run).
- **measured (this machine)**: both runs' own pace on the shared CPU, beside it; what running
  ahead gains here is bounded by the cores the two sides leave idle.

Usage: ``python bench/async_rl.py [--rounds 5] [--steps 12] [--max-off-policy 1] [--max-tokens 4]``
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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--max-off-policy", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the emulator")
    ns = ap.parse_args()
    for name in ("rounds", "steps", "max_tokens", "threads"):
        if getattr(ns, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be 1 or more")
    if ns.max_off_policy < 1:
        ap.error("--max-off-policy must be 1 or more (0 is the synchronous loop it is compared to)")
    os.environ["OMP_NUM_THREADS"] = str(ns.threads)  # the daemon inherits it
    import tgnb.tinker as tinker
    from tgnb.emulator.testing import running_emulator
    from tgnb.tinker.async_rl import PieceSeconds, modelled_steps_per_minute

    modelled, measured, fits, fits_async, loads = [], [], [], [], []
    print(
        "modelled: each resource its own GPU, each piece's GPU time the seconds it took alone in "
        "the round's synchronous run; measured: both runs on this machine's shared CPU",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="tgnb-bench-async-") as tmp,
        running_emulator(Path(tmp), time_scale=0.01) as emu,
    ):
        os.environ.update(TOGETHER_BASE_URL=emu.base_url, TOGETHER_API_KEY=emu.api_key)
        caps = tinker.RestClient().get_server_capabilities().result()  # as tinker 0.38 asks
        base_model = str(caps.supported_models[0].model_name)
        for r in range(ns.rounds):
            load = os.getloadavg()[0]
            order = [0, ns.max_off_policy] if r % 2 == 0 else [ns.max_off_policy, 0]
            got = {lag: one(tinker, base_model, lag, ns) for lag in order}
            sync, asyn = got[0], got[ns.max_off_policy]
            load = max(load, os.getloadavg()[0])
            pieces = PieceSeconds.of(sync)
            m_sync = modelled_steps_per_minute(pieces, 0)
            m_async = modelled_steps_per_minute(pieces, ns.max_off_policy)
            modelled.append(m_async / m_sync)
            measured.append(asyn.steps_per_minute / sync.steps_per_minute)
            own = PieceSeconds.of(asyn)  # the async run's pieces, slowed by the shared CPU
            fit_async = modelled_steps_per_minute(own, ns.max_off_policy) / asyn.steps_per_minute
            fits.append(m_sync / sync.steps_per_minute)
            fits_async.append(fit_async)
            loads.append(load)
            # after the first step, whose batch waits for the sampler's resource to load the model
            sampled, trained = sum(pieces.sampling[1:]), sum(pieces.training[1:])
            share = sampled / (sampled + trained)
            print(
                f"round {r + 1} (load {load:.2f}): modelled async / sync {modelled[-1]:.2f} "
                f"({m_async:.1f} vs {m_sync:.1f} steps/min, fit {fits[-1]:.2f} / {fit_async:.2f}, sampling "
                f"{share:.0%} of the GPU work); measured {measured[-1]:.2f} "
                f"({asyn.steps_per_minute:.1f} vs {sync.steps_per_minute:.1f} steps/min, both "
                f"busy {asyn.overlap_seconds():.1f} s of {asyn.seconds:.1f} s), lags "
                f"{sorted({h['lag'] for h in asyn.history})}",
                flush=True,
            )
    print(
        f"median of {ns.rounds} rounds (load average {statistics.median(loads):.2f}, max "
        f"{max(loads):.2f}): async / sync steps per minute, modelled on separate GPUs "
        f"{statistics.median(modelled):.2f} (fit {statistics.median(fits):.2f} / "
        f"{statistics.median(fits_async):.2f}); measured on "
        f"this machine's shared CPU {statistics.median(measured):.2f}. "
        f"{ns.steps} steps, max_off_policy={ns.max_off_policy}, {ns.max_tokens} tokens a sample, "
        f"{ns.threads} torch thread(s), {os.cpu_count()} CPU(s)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
