"""Asynchronous RL on Tinker's API: the rollouts of policy version k are sampled while the trainer
trains version k+1, so neither the generator nor the trainer waits for the other.

The loop is the stock Tinker one (``sample`` -> rewards -> ``forward_backward`` with the
``importance_sampling`` loss -> ``optim_step``), with one change: up to `max_off_policy` batches
of rollouts are in flight ahead of the trainer. A batch sampled by version v is trained at version
k >= v; the loss takes the sampler's own logprobs (the behaviour policy), so its ratio
``exp(logp_now - logp_sampler)`` is the importance correction for those k - v versions of lag
(``ppo`` clips it). ``max_off_policy=0`` is the synchronous loop, the same code waiting.

Each policy version is published the Tinker way, ``save_weights_for_sampler`` then
``create_sampling_client(model_path=...)``: the sampler runs on its own session (on
Post-Training, on a resource with a generator; the trainer's has none), so sampling never queues
behind the trainer's operations, which a session runs first in, first out.

    python -m tgnb.tinker.async_rl --steps 20 --max-off-policy 1 --out async.json

runs it against ``TOGETHER_BASE_URL`` / ``TOGETHER_API_KEY`` (the local emulator when they point
at it: ``tgnb emulator start`` prints both); ``--model`` defaults to the first model the service
lists. `run` returns the per-step history (reward, loss, the lag trained at) and a timeline of
when the trainer and the generator were busy (from the client: a request in flight), which
notebook ``07-async-rl`` draws beside the synchronous loop's and ``bench/async_rl.py`` turns into
steps per minute, async / sync. Every setting is checked before anything is provisioned
(`check_settings`; the script: one line and exit status 2).

`modelled_seconds` is the service's regime, modelled: each resource its own GPU. On the emulator
the trainer's and the sampler's resources share this machine's CPU, so running ahead there gains
only the cores they leave idle. The model takes what each piece of a run cost when it ran alone
(a synchronous run: the generator's batches, the client's rewards, the trainer's
forward_backward + optim_step, saving each version's sampler weights, opening its sampler; each
measured from the client) as that piece's GPU time, and schedules the loop's pieces with
`max_off_policy` versions of lag on two GPUs: the trainer's resource (training, saving) and the
sampler's (sampling, one batch at a time), each piece waiting for what the loop makes it wait
for. Fed a run's own pieces, the model replays that run's measured pace, synchronous or not.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tgnb.tasks import data, rewards
from tgnb.tinker._gpumodel import PieceSeconds, modelled_seconds, modelled_steps_per_minute

__all__ = [
    "PieceSeconds",
    "Rollouts",
    "RunResult",
    "SettingError",
    "check_settings",
    "modelled_seconds",
    "modelled_steps_per_minute",
    "run",
]


class SettingError(ValueError):
    """A setting of the loop that cannot run; the message names the fix (and starts with the
    setting's name, `setting`)."""

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message)
        self.setting = setting


def check_settings(
    *,
    steps: int,
    max_off_policy: int,
    prompts_per_step: int,
    group_size: int,
    max_tokens: int,
    learning_rate: float,
    rank: int,
    loss: str,
    seed: int,
) -> None:
    """Raise `SettingError` (one line naming the fix) for a setting `run` cannot honour; called
    before anything is opened on the service."""
    counts = {
        "steps": (steps, 1),
        "max_off_policy": (max_off_policy, 0),
        "prompts_per_step": (prompts_per_step, 1),
        "group_size": (group_size, 1),
        "max_tokens": (max_tokens, 1),
        "rank": (rank, 1),
        "seed": (seed, 0),
    }
    for name, (value, least) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingError(f"{name} must be an integer, not {value!r}", name)
        if value < least:
            what = "0 (synchronous) or more" if name == "max_off_policy" else f"{least} or more"
            raise SettingError(f"{name} must be {what}, not {value}", name)
    if (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, int | float)
        or not math.isfinite(learning_rate)
        or learning_rate <= 0
    ):
        raise SettingError(
            f"learning_rate must be a finite number above 0, not {learning_rate!r}", "learning_rate"
        )
    if loss not in LOSSES:
        raise SettingError(f"loss must be one of {', '.join(LOSSES)}, not {loss!r}", "loss")


#: The losses the loop's data carries inputs for (the sampler's logprobs and the advantages).
LOSSES = ("importance_sampling", "ppo")


@dataclass
class Rollouts:
    """One batch of questions sampled by policy `version`: when it was submitted, and its
    results with the time the last one arrived."""

    index: int
    version: int
    rows: list[dict[str, Any]]
    prompts: list[list[int]]
    submitted: float
    results: Future[tuple[list[Any], float]]


@dataclass
class RunResult:
    """What `run` measured: one history row per step and the busy intervals (seconds from the
    start) of the trainer (forward_backward + optim_step), of publishing each version (its
    sampler checkpoint and the sampler opened on it) and of the generator (a batch's rollouts,
    submitted to arrived)."""

    max_off_policy: int
    history: list[dict[str, Any]] = field(default_factory=list)
    trainer: list[tuple[float, float]] = field(default_factory=list)
    publishing: list[tuple[float, float]] = field(default_factory=list)
    generator: list[tuple[float, float]] = field(default_factory=list)
    opening: list[tuple[float, float]] = field(default_factory=list)  # the part of publishing
    #: per step: when its batch's rollouts were in hand (the rewards and data start there)
    arrived: list[float] = field(default_factory=list)
    seconds: float = 0.0
    checkpoint: str = ""

    @property
    def steps_per_minute(self) -> float:
        """Steps per minute after the first step (which waits for the first rollouts, and for
        the service to load the model on a new sampler resource): the pace the loop keeps."""
        if len(self.history) < 2:
            return 0.0
        first, last = self.history[0]["time"], self.history[-1]["time"]
        return 60.0 * (len(self.history) - 1) / (last - first)

    def overlap_seconds(self) -> float:
        """Seconds in which the generator (any batch) and the trainer were both busy."""
        merged: list[list[float]] = []
        for g0, g1 in sorted(self.generator):
            if merged and g0 <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], g1)
            else:
                merged.append([g0, g1])
        return sum(
            max(0.0, min(g1, t1) - max(g0, t0)) for g0, g1 in merged for t0, t1 in self.trainer
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_off_policy": self.max_off_policy,
            "steps_per_minute": self.steps_per_minute,
            "seconds": self.seconds,
            "overlap_seconds": self.overlap_seconds(),
            "history": self.history,
            "trainer": self.trainer,
            "publishing": self.publishing,
            "generator": self.generator,
            "opening": self.opening,
            "arrived": self.arrived,
            "checkpoint": self.checkpoint,
        }


def _advantages(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return [(v - mean) / (std + 1e-6) for v in values]


def run(
    tinker: Any,
    service: Any,
    base_model: str,
    *,
    steps: int = 20,
    max_off_policy: int = 1,
    prompts_per_step: int = 8,
    group_size: int = 8,
    max_tokens: int = 1,
    learning_rate: float = 3e-3,
    rank: int = 8,
    loss: str = "importance_sampling",
    seed: int = 0,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> RunResult:
    """Train `steps` steps of RL on the built-in arithmetic task through `service` (a Tinker
    ``ServiceClient``; `tinker` the module it came from), with at most `max_off_policy` versions
    of lag between the policy that sampled a batch and the one that trains on it. Settings it
    cannot honour raise `SettingError` before anything is opened."""
    check_settings(
        steps=steps,
        max_off_policy=max_off_policy,
        prompts_per_step=prompts_per_step,
        group_size=group_size,
        max_tokens=max_tokens,
        learning_rate=learning_rate,
        rank=rank,
        loss=loss,
        seed=seed,
    )
    types = tinker.types
    rows = data.arithmetic_rows(steps * prompts_per_step, seed=seed)
    training = service.create_lora_training_client(base_model=base_model, rank=rank, seed=seed)
    tokenizer = training.get_tokenizer()
    out = RunResult(max_off_policy)
    t0 = time.monotonic()

    def now() -> float:
        return time.monotonic() - t0

    def publish(version: int) -> Any:
        path = training.save_weights_for_sampler(f"v{version}").result().path
        started = now()
        sampler = service.create_sampling_client(model_path=path)
        if version:
            out.opening.append((started, now()))
        return sampler

    def submit(index: int, sampler: Any, version: int) -> Rollouts:
        batch = rows[index * prompts_per_step : (index + 1) * prompts_per_step]
        prompts = [tokenizer.encode(r["prompt"]) for r in batch]
        params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + index)
        started = now()

        def sampled() -> tuple[list[Any], float]:
            futures = [
                sampler.sample(
                    prompt=types.ModelInput.from_ints(p),
                    num_samples=group_size,
                    sampling_params=params,
                )
                for p in prompts
            ]
            return [f.result() for f in futures], now()

        # submitted and read on a thread of its own: a submission may wait for its answer (the
        # emulator answers a quick operation inside its POST), and the time is the generator's
        return Rollouts(index, version, batch, prompts, started, reader.submit(sampled))

    def datums(r: Rollouts, results: list[Any]) -> tuple[list[Any], list[float]]:
        made, scores = [], []
        for row, prompt, result in zip(r.rows, r.prompts, results, strict=True):
            sequences = result.sequences
            texts = [tokenizer.decode(s.tokens, skip_special_tokens=True) for s in sequences]
            n = len(texts)
            correct = rewards.correctness([row["prompt"]] * n, texts, answer=[row["answer"]] * n)
            fmt = rewards.format_reward([row["prompt"]] * n, texts)
            values = [c + 0.5 * f for c, f in zip(correct, fmt, strict=True)]
            scores += values
            for seq, adv in zip(sequences, _advantages(values), strict=True):
                tokens = [int(t) for t in seq.tokens]
                if not tokens:
                    continue
                full, pad = prompt + tokens, [0.0] * (len(prompt) - 1)
                made.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={
                            "target_tokens": full[1:],
                            "logprobs": pad + [float(x) for x in seq.logprobs],
                            "advantages": pad + [adv] * len(tokens),
                        },
                    )
                )
        return made, scores

    reader = ThreadPoolExecutor(max_workers=max_off_policy + 1, thread_name_prefix="tgnb-rollouts")
    try:
        version = 0
        sampler = publish(version)
        pending: collections.deque[Rollouts] = collections.deque()
        queued = 0
        for step in range(steps):
            # keep the generator busy: batches up to `max_off_policy` versions ahead of training
            while queued < steps and queued <= step + max_off_policy:
                pending.append(submit(queued, sampler, version))
                queued += 1
            batch = pending.popleft()
            results, arrived_at = batch.results.result()
            out.generator.append((batch.submitted, arrived_at))
            out.arrived.append(now())
            made, scores = datums(batch, results)
            lag = version - batch.version
            assert 0 <= lag <= max_off_policy, (lag, max_off_policy)
            started = now()
            fb = training.forward_backward(made, loss)
            opt = training.optim_step(types.AdamParams(learning_rate=learning_rate))
            metrics = fb.result().metrics
            opt.result()
            out.trainer.append((started, now()))
            version += 1
            started = now()
            sampler = publish(version)  # the old sampler's in-flight batches still answer
            out.publishing.append((started, now()))
            row = {
                "step": step + 1,
                "reward": sum(scores) / len(scores),
                "loss": metrics.get("loss:sum"),
                "lag": lag,
                "time": now(),
            }
            out.history.append(row)
            if on_step is not None:
                on_step(row)
        out.seconds = now()
        out.checkpoint = training.save_state("final").result().path
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
        training.close()
    return out


class _Parser(argparse.ArgumentParser):
    """Bad arguments: one line naming the fix, exit status 2 (argparse's usage block is for
    ``--help``)."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def check_against_service(
    listed: list[Any], model: str, rank: int, rows: int, max_tokens: int
) -> str:
    """`model` (empty: the first listed), checked against the service's `listed` supported
    models (the API's ``RlSupportedModel`` entries): it is listed, and the LoRA rank, the datums of a
    step and the tokens sampled fit its limits. Raises `SettingError` naming the fix."""
    names = [str(m.base_model) for m in listed]
    if not names:
        raise SettingError("the service lists no base model to train")
    model = model or names[0]
    if model not in names:
        raise SettingError(f"--model {model!r} is not a model the service lists: one of {names}")
    entry = listed[names.index(model)]
    for cfg in getattr(entry, "compute_configs", None) or []:
        lora = getattr(getattr(cfg, "trainer_config", None), "lora", None)
        max_rank = getattr(lora, "max_rank", None)
        max_batch = getattr(lora, "max_batch_size", None)
        context = getattr(getattr(cfg, "generator_config", None), "context_length", None)
        if max_rank and rank > max_rank:
            raise SettingError(f"--rank {rank} is above {model}'s largest LoRA rank, {max_rank}")
        if max_batch and rows > max_batch:
            raise SettingError(
                f"--prompts x --group is {rows} datums a step, above {model}'s batch of "
                f"{max_batch}: lower one of them"
            )
        if context and max_tokens >= context:
            raise SettingError(
                f"--max-tokens {max_tokens} leaves no room for the prompt in {model}'s context "
                f"of {context} tokens"
            )
    return model


def _writable(path: str) -> None:
    if not path:
        return
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise SettingError(f"--out {path} is a folder: name a file in it")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise SettingError(f"--out {path}: {folder} is not a folder this process can write in")


def _listed_models(conn: Any) -> list[Any]:
    """The service's supported models (the first request the script makes); a service that
    cannot be reached, or refuses the key, is a `SettingError` naming the variable to fix."""
    import together

    try:
        return list(conn.sdk().post_training.supported_models.get().data or [])
    except together.AuthenticationError:
        raise SettingError(
            "the service refused the API key: set TOGETHER_API_KEY to a key of the service at "
            f"{conn.base_url or 'https://api.together.xyz'}"
        ) from None
    except together.APIConnectionError:
        raise SettingError(
            f"cannot reach the service at {conn.base_url}: check TOGETHER_BASE_URL (unset: Together)"
        ) from None


#: `run`'s settings under the script's option names.
FLAGS = {
    "steps": "--steps",
    "max_off_policy": "--max-off-policy",
    "prompts_per_step": "--prompts",
    "group_size": "--group",
    "max_tokens": "--max-tokens",
    "learning_rate": "--lr",
    "rank": "--rank",
    "loss": "--loss",
    "seed": "--seed",
}


def main(argv: list[str] | None = None) -> None:
    from tgnb.connection import of_sdk_keywords
    from tgnb.errors import ConfigError

    doc = __doc__ or ""
    p = _Parser(prog="python -m tgnb.tinker.async_rl", description=doc.split("\n")[0])
    p.add_argument(
        "--model", default="", help="a base model the service lists (default: its first)"
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--max-off-policy", type=int, default=1, help="0: the synchronous loop")
    p.add_argument("--prompts", type=int, default=8, help="questions per step")
    p.add_argument("--group", type=int, default=8, help="samples per question")
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--loss", default="importance_sampling", choices=LOSSES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="write the history and timeline as JSON here")
    args = p.parse_args(argv)
    settings = dict(
        steps=args.steps,
        max_off_policy=args.max_off_policy,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_tokens=args.max_tokens,
        learning_rate=args.lr,
        rank=args.rank,
        loss=args.loss,
        seed=args.seed,
    )
    try:  # everything is checked before the service is asked for anything
        check_settings(**settings)
        _writable(args.out)

        listed = _listed_models(of_sdk_keywords(None, None))
        model = check_against_service(
            listed, args.model, args.rank, args.prompts * args.group, args.max_tokens
        )
    except (SettingError, ConfigError) as exc:  # ConfigError: no key for the service
        message = str(exc)
        setting = getattr(exc, "setting", "")
        if setting in FLAGS:  # the script's own name for the setting
            message = FLAGS[setting] + message.removeprefix(setting)
        p.exit(2, f"{p.prog}: {message}\n")
    import tgnb.tinker as tinker

    with tinker.ServiceClient() as service:
        result = run(
            tinker,
            service,
            model,
            on_step=lambda row: print(json.dumps(row), flush=True),
            **settings,
        )
    summary = {
        "steps_per_minute": round(result.steps_per_minute, 2),
        "checkpoint": result.checkpoint,
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result.as_dict(), fh, indent=1)


if __name__ == "__main__":
    main()
