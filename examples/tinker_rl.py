"""A Tinker RL loop (importance-sampling policy gradient on a tiny arithmetic task) that runs on
Together Post-Training, or on tgnb's local emulator, with one line changed: the import.

    # on Tinker:                       import tinker
    # on Together (this file):         import tgnb.tinker as tinker

Everything else is the stock Tinker API: ``ServiceClient().create_lora_training_client``,
``save_weights_and_get_sampling_client`` / ``sample``, ``forward_backward`` with the
``importance_sampling`` (or ``ppo``) loss, ``optim_step``, ``save_state``. The tokenizer is loaded
locally by the base model's name, as Tinker scripts do.

Against the local emulator (``tgnb emulator start`` prints the URL; the key is in its key file)::

    export TOGETHER_BASE_URL=http://127.0.0.1:PORT TOGETHER_API_KEY=...   # no /v1
    MODEL=$(python -c "from together import Together as T; print(T().post_training.supported_models.get().data[0].base_model)")
    python examples/tinker_rl.py --model "$MODEL" --steps 30

(the emulator lists its built-in model by its local directory, so the tokenizer loads with no Hub
call; ``tgnb/tiny-llama``, its alias, trains too, but ``from_pretrained`` of a hub-style name
asks the Hub first).

Against Together: unset TOGETHER_BASE_URL, set TOGETHER_API_KEY and pick a supported model (and a
longer ``--max-tokens``). Needs ``pip install 'tgnb[tinker]'`` (``tinker==0.23.1``).
"""

from __future__ import annotations

import argparse
import json
import random
import re

from transformers import AutoTokenizer

import tgnb.tinker as tinker  # the one line that differs from a Tinker script

T = tinker.types


def questions(n: int, seed: int) -> list[tuple[str, int]]:
    """`n` questions "What is a+b? Answer:" (a, b in 0..2) with their answers."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 2), rng.randint(0, 2)
        out.append((f"What is {a}+{b}? Answer:", a + b))
    return out


def reward(text: str, answer: int) -> float:
    """1 for the right number, plus 0.5 for answering with a bare number."""
    match = re.match(r"\s*(-?\d+)", text)
    if not match:
        return 0.0
    return 0.5 + (1.0 if int(match.group(1)) == answer else 0.0)


def advantages(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return [(v - mean) / (std + 1e-6) for v in values]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a base model the service lists")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--prompts", type=int, default=8, help="questions per step")
    p.add_argument("--group", type=int, default=8, help="samples per question")
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="write the per-step history as JSON here")
    args = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(
        base_model=args.model, rank=args.rank, seed=args.seed
    )
    sampler = training.save_weights_and_get_sampling_client()
    data = questions(args.steps * args.prompts, args.seed)
    history = []
    for step in range(args.steps):
        batch = data[step * args.prompts : (step + 1) * args.prompts]
        prompts = [tokenizer.encode(q) for q, _ in batch]
        params = T.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=step)
        futures = [
            sampler.sample(
                prompt=T.ModelInput.from_ints(p), num_samples=args.group, sampling_params=params
            )
            for p in prompts
        ]
        datums, scores = [], []
        for (_, answer), prompt, future in zip(batch, prompts, futures, strict=True):
            sequences = future.result().sequences
            values = [
                reward(tokenizer.decode(s.tokens, skip_special_tokens=True), answer)
                for s in sequences
            ]
            scores += values
            for seq, adv in zip(sequences, advantages(values), strict=True):
                tokens = [int(t) for t in seq.tokens]
                if not tokens:
                    continue
                full, pad = prompt + tokens, [0.0] * (len(prompt) - 1)
                datums.append(
                    T.Datum(
                        model_input=T.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={
                            "target_tokens": full[1:],
                            "logprobs": pad + [float(x) for x in seq.logprobs],
                            "advantages": pad + [adv] * len(tokens),
                        },
                    )
                )
        fb = training.forward_backward(datums, args.loss)
        opt = training.optim_step(T.AdamParams(learning_rate=args.lr))
        loss = fb.result().metrics.get("loss:sum")
        opt.result()
        sampler = training.save_weights_and_get_sampling_client()
        history.append({"step": step + 1, "reward": sum(scores) / len(scores), "loss": loss})
        print(json.dumps(history[-1]), flush=True)
    state = training.save_state("final").result().path
    print(json.dumps({"checkpoint": state}), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump({"history": history, "checkpoint": state}, fh, indent=1)
    training.close()


if __name__ == "__main__":
    main()
