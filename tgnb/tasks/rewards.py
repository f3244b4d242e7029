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


def check_signature(func: Any, name: str) -> None:
    """Raise `TrainConfigError` unless `func` accepts what TRL passes: ``f(prompts, completions,
    **kwargs)`` (keyword arguments, plus the dataset's columns through ``**kwargs``)."""
    if not callable(func):
        raise TrainConfigError(f"reward '{name}' is not a function; point it at a callable.")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return  # builtins without a signature: let TRL call it
    has_varkw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    try:
        sig.bind(**dict.fromkeys(TRL_REWARD_KWARGS))
    except TypeError:
        has_varkw = False
    if not has_varkw:
        short = name.rsplit(":", 1)[-1]
        raise TrainConfigError(
            f"reward '{name}' has signature {short}{sig}; a GRPO reward must be "
            "f(prompts, completions, **kwargs) -> list[float]."
        )


def resolve(name: str) -> RewardFunc:
    """A reward function by built-in name or ``package.module:function``; its signature is checked."""
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
    check_signature(func, name)
    return func  # type: ignore[return-value]


def resolve_all(names: list[str]) -> list[RewardFunc]:
    return [resolve(n) for n in names]
