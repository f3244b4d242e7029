"""Validation of operation bodies: samples, model inputs and TensorData, before any computation.

Every refusal is an `RLInputError` naming the field (the server answers 400 or fails the
operation with INVALID_INPUT); nothing is computed or changed before the whole body is valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tgnb.errors import TgnbError, ValidationError

if TYPE_CHECKING:
    import torch


class RLInputError(ValidationError):
    """A bad Post-Training request: `field` names what to fix (-> 400 / FAILED INVALID_INPUT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


#: Per-operation work caps (docs/limits.md, "Post-Training requests"): samples (or sampled rows) per
#: operation, as supported-models' ``max_batch_size`` says; tokens one forward-backward reads;
#: tokens one sample operation generates (rows x max_tokens).
MAX_BATCH_SIZE = 512
MAX_OP_TOKENS = 32768
MAX_SAMPLE_TOKENS = 32768
#: The largest magnitude a float32 holds: an input beyond it would be inf once on the device.
FLOAT32_MAX = 3.4028234663852886e38
INT64_RANGE = (-(2**63), 2**63 - 1)

#: A session's LoRA settings when the request leaves them out (train_unembed: a LoRA on the head).
DEFAULT_LORA: dict[str, Any] = {"rank": 32, "alpha": 32, "dropout": 0.0, "train_unembed": True}


class NonFiniteLoss(TgnbError, RuntimeError):
    """The loss was NaN or infinite; no gradient was accumulated (-> FAILED NON_FINITE_LOSS)."""


class OperationCancelled(TgnbError, RuntimeError):
    """The session was stopped while its operation ran (-> FAILED SESSION_NOT_ACTIVE)."""


class ResourceAtCapacity(TgnbError, RuntimeError):
    """The resource already holds its maximum of sessions (-> 429 with retry-after-ms)."""


def model_tokens(model_input: Any, field: str, vocab_size: int, max_len: int) -> list[int]:
    """The token ids of a ``ModelInput`` (``{chunks: [{encoded_text: {tokens}}]}``)."""
    if not isinstance(model_input, Mapping) or not isinstance(model_input.get("chunks"), list):
        raise RLInputError(field, "must be {'chunks': [{'encoded_text': {'tokens': [...]}}]}")
    tokens: list[int] = []
    for j, chunk in enumerate(model_input["chunks"]):
        text = chunk.get("encoded_text") if isinstance(chunk, Mapping) else None
        if not isinstance(text, Mapping) or not isinstance(text.get("tokens"), list):
            raise RLInputError(
                f"{field}.chunks[{j}]",
                "only encoded_text chunks with a 'tokens' list are supported",
            )
        for t in text["tokens"]:
            try:
                value = int(t)
            except (TypeError, ValueError):
                raise RLInputError(
                    f"{field}.chunks[{j}]", f"token {t!r} is not an integer"
                ) from None
            if isinstance(t, bool) or (isinstance(t, float) and t != value):
                raise RLInputError(f"{field}.chunks[{j}]", f"token {t!r} is not an integer")
            if not 0 <= value < vocab_size:
                raise RLInputError(
                    f"{field}.chunks[{j}]",
                    f"token {value} outside the vocabulary [0, {vocab_size})",
                )
            tokens.append(value)
    if not tokens:
        raise RLInputError(field, "has no tokens")
    if len(tokens) > max_len:
        raise RLInputError(field, f"{len(tokens)} tokens exceed the context length {max_len}")
    return tokens


def tensor(value: Any, field: str, dtypes: frozenset[str], length: int) -> torch.Tensor:
    """A 1-D TensorData ``{data, dtype, shape?}`` as a float64 tensor of exactly `length` values."""
    import torch

    if not isinstance(value, Mapping) or not isinstance(value.get("data"), list):
        raise RLInputError(field, "must be TensorData {'data': [...], 'dtype': 'int64'|'float32'}")
    dtype = value.get("dtype")
    if dtype not in dtypes:
        raise RLInputError(
            field, f"dtype {dtype!r} not accepted here (use {' or '.join(sorted(dtypes))})"
        )
    for key in ("sparse_col_indices", "sparse_crow_indices"):
        if value.get(key) is not None:
            raise RLInputError(field, "sparse tensors are not supported; send dense 1-D data")
    data = value["data"]
    shape = value.get("shape")
    if shape is not None and (not isinstance(shape, list) or shape != [len(data)]):
        raise RLInputError(field, f"shape {str(shape)[:40]} is not the 1-D list [{len(data)}]")
    if len(data) != length:
        raise RLInputError(
            field, f"has {len(data)} values, expected {length} (one per model_input token)"
        )
    if any(isinstance(x, (bool, str)) or not isinstance(x, (int, float)) for x in data):
        raise RLInputError(field, "data must be a list of numbers")
    lo, hi = INT64_RANGE
    if any(isinstance(x, int) and not lo <= x <= hi for x in data):  # beyond float64 too
        raise RLInputError(field, "holds an integer outside the int64 range")
    t = torch.tensor(data, dtype=torch.float64)
    if not bool(torch.isfinite(t).all()):
        raise RLInputError(field, "contains NaN or infinite values")
    if dtype == "int64" and not bool((t == t.round()).all()):
        raise RLInputError(field, "int64 data must hold integers")
    if "float32" in str(dtype).lower() and bool((t.abs() > FLOAT32_MAX).any()):
        big = float(t.abs().max())
        raise RLInputError(
            field, f"holds {big:.3g}, beyond float32's range (|x| <= {FLOAT32_MAX:.4g})"
        )
    return t


@dataclass
class Batch:
    """Samples right-padded into one batch: `inputs[name]` is `[B, T]`, `valid` marks real slots."""

    tokens: list[list[int]]
    inputs: dict[str, torch.Tensor]
    valid: torch.Tensor

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]


def batch(
    samples: Any,
    *,
    required: frozenset[str],
    optional: frozenset[str],
    dtypes: Mapping[str, frozenset[str]],
    vocab_size: int,
    max_len: int,
    field: str = "samples",
) -> Batch:
    """Validate `samples` ([{model_input, loss_fn_inputs}]) and pad them into one `Batch`."""
    import torch

    if not isinstance(samples, Sequence) or isinstance(samples, (str, bytes)) or not samples:
        raise RLInputError(field, "must be a non-empty list of samples")
    if len(samples) > MAX_BATCH_SIZE:
        raise RLInputError(
            field, f"{len(samples)} samples exceed max_batch_size {MAX_BATCH_SIZE}; split the batch"
        )
    total = 0
    tokens: list[list[int]] = []
    columns: dict[str, list[torch.Tensor]] = {}
    names: set[str] | None = None
    for i, sample in enumerate(samples):
        where = f"{field}[{i}]"
        if not isinstance(sample, Mapping):
            raise RLInputError(where, "must be {'model_input': ..., 'loss_fn_inputs': {...}}")
        toks = model_tokens(sample.get("model_input"), f"{where}.model_input", vocab_size, max_len)
        total += len(toks)
        if total > MAX_OP_TOKENS:
            raise RLInputError(
                field, f"more than {MAX_OP_TOKENS} tokens in one operation; split the batch"
            )
        fn_inputs = sample.get("loss_fn_inputs") or {}
        if not isinstance(fn_inputs, Mapping):
            raise RLInputError(f"{where}.loss_fn_inputs", "must be an object of TensorData")
        keys = set(fn_inputs)
        missing = sorted(required - keys)
        if missing:
            raise RLInputError(f"{where}.loss_fn_inputs.{missing[0]}", "is required by this loss")
        unknown = sorted(keys - required - optional)
        if unknown:
            accepted = ", ".join(sorted(required | optional))
            raise RLInputError(
                f"{where}.loss_fn_inputs.{unknown[0]}", f"is not an input of this loss ({accepted})"
            )
        if "weights" in keys and "mask" in keys:
            raise RLInputError(f"{where}.loss_fn_inputs", "give weights or mask, not both")
        if names is not None and keys != names:
            raise RLInputError(
                f"{where}.loss_fn_inputs", "every sample must carry the same inputs as the first"
            )
        names = keys
        for key in sorted(keys):
            columns.setdefault(key, []).append(
                tensor(fn_inputs[key], f"{where}.loss_fn_inputs.{key}", dtypes[key], len(toks))
            )
        tokens.append(toks)
    width = max(len(t) for t in tokens)
    valid = torch.zeros(len(tokens), width, dtype=torch.bool)
    for i, t in enumerate(tokens):
        valid[i, : len(t)] = True
    padded = {}
    for key, values in columns.items():
        padded[key] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True)
    if "target_tokens" in padded:
        padded["target_tokens"] = padded["target_tokens"].long()
        if bool(
            (padded["target_tokens"] < 0).any() or (padded["target_tokens"] >= vocab_size).any()
        ):
            raise RLInputError(
                f"{field}[].loss_fn_inputs.target_tokens", f"ids must lie in [0, {vocab_size})"
            )
    return Batch(tokens, padded, valid)


def gradients(value: Any, lengths: Sequence[int], field: str = "gradients") -> list[torch.Tensor]:
    """The per-sample dL/dlogprob tensors of a custom forward-backward."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise RLInputError(field, "must be a list of TensorData, one per sample")
    if len(value) != len(lengths):
        raise RLInputError(field, f"has {len(value)} entries for {len(lengths)} samples")
    accepted = frozenset({"float32", "D_TYPE_FLOAT32"})
    return [
        tensor(g, f"{field}[{i}]", accepted, n)
        for i, (g, n) in enumerate(zip(value, lengths, strict=False))
    ]


def lora_config(config: Any, max_rank: int) -> dict[str, Any]:
    """`config` checked and completed with `DEFAULT_LORA`; RLInputError("lora_config.<key>", ...)."""
    if config is not None and not isinstance(config, Mapping):
        raise RLInputError("lora_config", "must be an object")

    cfg = dict(DEFAULT_LORA)
    given = dict(config or {})
    unknown = sorted(set(given) - {"rank", "alpha", "dropout", "seed", "train_unembed"})
    if unknown:
        raise RLInputError(f"lora_config.{unknown[0]}", "unknown LoRA setting")
    given = {k: v for k, v in given.items() if v is not None}
    rank = given.get("rank", cfg["rank"])
    limit = max_rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= limit:
        raise RLInputError("lora_config.rank", f"must be an integer in 1..{limit}, got {rank!r}")
    alpha = given.get("alpha", cfg["alpha"])
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1e6:
        raise RLInputError("lora_config.alpha", f"must be a number in (0, 1e6], got {alpha!r}")
    dropout = given.get("dropout", cfg["dropout"])
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise RLInputError("lora_config.dropout", f"must be in [0, 1), got {dropout!r}")
    unembed = given.get("train_unembed", cfg["train_unembed"])
    if not isinstance(unembed, bool):
        raise RLInputError("lora_config.train_unembed", "must be true or false")
    seed = given.get("seed")
    if seed is not None:
        try:
            seed = int(seed)
        except (TypeError, ValueError, OverflowError):
            raise RLInputError("lora_config.seed", f"must be an integer, got {seed!r}") from None
        if not 0 <= seed < 2**63:  # torch.manual_seed's range
            raise RLInputError("lora_config.seed", f"must be in [0, 2**63), got {seed}")
    return {"rank": rank, "alpha": alpha, "dropout": float(dropout), "seed": seed,
            "train_unembed": unembed}  # fmt: skip


def body_object(body: Any) -> dict[str, Any]:
    """An operation's JSON body as a dict (none: empty); anything else is refused."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise RLInputError("body", "must be a JSON object")
    return body


def flag(body: dict[str, Any], key: str) -> bool:
    """A boolean option of a body (absent or null: False)."""
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RLInputError(key, "must be true or false")
    return value


def logprob_outputs(logp: torch.Tensor, lengths: list[int]) -> list[dict[str, Any]]:
    """Each row's first `lengths[i]` log-probabilities as TensorData (``loss_fn_outputs``)."""
    rows = logp.cpu().tolist()
    return [
        {"tensors": {"logprobs": {"data": row[:n], "dtype": "float32", "shape": [n]}}}
        for row, n in zip(rows, lengths, strict=False)
    ]
