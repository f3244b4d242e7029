"""`%tg launch --recovery/--min-nodes` and the ``recovery:`` key of a ``%%tg launch`` body reach
`Session.launch` as its options (the parse alone: the policy itself is tested in tests/runs)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from tgnb.notebook.commands import COMMANDS
from tgnb.notebook.commands.launch import launch_request


def request(line: str, cell: str | None = None) -> tuple[dict[str, object], dict[str, object]]:
    return launch_request(COMMANDS["launch"].parser.parse_args(line.split()), cell)


def test_flags_and_body_key() -> None:
    _, options = request("grpo --nodes 2 --min-nodes 1 --recovery shrink")
    assert options == {"nodes": 2, "min_nodes": 1, "recovery": "shrink"}
    raw, options = request("grpo", "recovery: {when_short: standard, wait_s: 60}\nmax_steps: 5")
    assert options["recovery"] == {"when_short": "standard", "wait_s": 60}
    assert "recovery" not in raw and raw["max_steps"] == 5


def test_an_unknown_policy_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="shrink"):
        request("grpo --recovery grow")
