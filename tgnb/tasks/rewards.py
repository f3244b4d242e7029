"""Reward functions for GRPO: the built-in ones by name, or any ``package.module:function``.

A reward function has TRL's signature ``f(prompts, completions, **kwargs) -> list[float]``; the
dataset's other columns (here ``answer``) arrive as keyword arguments, one value per completion.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from tgnb.errors import TrainConfigError

RewardFunc = Callable[..., list[float]]

_NUMBER = re.compile(r"-?\d+")
_ONLY_NUMBER = re.compile(r"\s*-?\d+\s*")


def _text(completion: Any) -> str:
    """The text of a completion, standard (a string) or conversational (a list of messages)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def parse_answer(completion: Any) -> int | None:
    """The first integer in a completion, or None when it has none."""
    match = _NUMBER.search(_text(completion))
    return int(match.group()) if match else None


def correctness(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 where the first integer in the completion equals the row's ``answer``, else 0.0."""
    answers = kwargs.get("answer")
    if answers is None:
        raise TrainConfigError(
            "reward 'correctness' needs an 'answer' column in the dataset; add one or drop the reward."
        )
    out = []
    for completion, answer in zip(completions, answers, strict=True):
        got = parse_answer(completion)
        out.append(1.0 if got is not None and got == int(answer) else 0.0)
    return out


def format_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 for a completion that is just a number, 0.5 for one that starts with a number, else 0."""
    out = []
    for completion in completions:
        text = _text(completion)
        if _ONLY_NUMBER.fullmatch(text):
            out.append(1.0)
        elif _NUMBER.match(text.lstrip()):
            out.append(0.5)
        else:
            out.append(0.0)
    return out


format_reward.__name__ = "format"

BUILTIN: dict[str, RewardFunc] = {"correctness": correctness, "format": format_reward}


#: The keyword arguments TRL's GRPOTrainer passes to every reward function, besides the dataset's
#: other columns (which is why a reward function needs ``**kwargs``).
TRL_REWARD_KWARGS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
)


def check_signature(func: Any, name: str, columns: list[str] | None = None) -> None:
    """Raise `TrainConfigError` unless `func` accepts what TRL passes: ``prompts``, ``completions``
    and the rest of `TRL_REWARD_KWARGS` by keyword, plus the dataset's other `columns` (TRL passes
    each as a keyword argument: a function may name them, ``f(completions, answer, **kwargs)``).
    Without **kwargs it must take every one of them by name. With `columns` unknown (a dataset
    not read at launch) the parameters it names beyond TRL's are taken to be columns."""
    if not callable(func):
        raise TrainConfigError(f"reward '{name}' is not a function; point it at a callable.")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return  # builtins without a signature: let TRL call it
    params = sig.parameters.values()
    has_varkw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    extra = [c for c in (columns or []) if c != "prompt"]
    passed = [*TRL_REWARD_KWARGS, *extra] if columns is not None else [*TRL_REWARD_KWARGS]
    short = name.rsplit(":", 1)[-1]
    if columns is not None:
        missing = [
            p.name
            for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            and p.default is inspect.Parameter.empty
            and p.name not in passed
        ]
        if missing:
            raise TrainConfigError(
                f"reward '{name}' has signature {short}{sig}: {missing[0]!r} is neither a TRL "
                f"argument nor a column of the dataset ({', '.join(extra) or 'none'}); a GRPO "
                "reward is f(prompts, completions, **kwargs) -> list[float], naming columns if "
                "it wants them."
            )
    if not has_varkw:
        left = [k for k in passed if k not in named]
        if left or columns is None:
            raise TrainConfigError(
                f"reward '{name}' has signature {short}{sig}; TRL also passes "
                f"{', '.join(left or TRL_REWARD_KWARGS)} by keyword: a GRPO reward must be "
                "f(prompts, completions, **kwargs) -> list[float]."
            )


def resolve(name: str, columns: list[str] | None = None) -> RewardFunc:
    """A reward function by built-in name or ``package.module:function``; its signature is
    checked against TRL's arguments and the dataset's `columns` (when known)."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, BUILTIN, n=3)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise TrainConfigError(
            f"unknown reward '{name}'.{hint} Use one of {sorted(BUILTIN)} or 'package.module:function'."
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TrainConfigError(
            f"reward '{name}': cannot import module '{module_name}' ({exc}); check the dotted path."
        ) from None
    func = module
    for part in attr.split("."):
        if not hasattr(func, part):
            raise TrainConfigError(
                f"reward '{name}': module '{module_name}' has no '{attr}'; check the function name."
            )
        func = getattr(func, part)
    check_signature(func, name, columns)
    return func  # type: ignore[return-value]


def resolve_all(names: list[str], columns: list[str] | None = None) -> list[RewardFunc]:
    return [resolve(n, columns) for n in names]
