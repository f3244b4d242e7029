"""``$TGNB_CHECKPOINT`` (the launch's checkpoint policy as JSON, `tgnb.runs.node.CHECKPOINT_ENV`)
as `tgnb.train.protect` and `tgnb.train.Checkpointer` read it (`run_context`): the launch's keys
win over the script's; a value that is not a JSON object of policy keys is a one-line
`TrainConfigError` naming the variable and the fix (it was a bare ``json.JSONDecodeError``, or a
``TypeError`` for a list or an unknown key). Nothing is faked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.errors import TrainConfigError
from tgnb.runs.node import CHECKPOINT_ENV
from tgnb.train.protect import run_context


def test_the_launch_policy_wins_key_by_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CHECKPOINT_ENV, '{"every_steps": 5}')
    ctx = run_context(tmp_path, {"every_steps": 100, "keep_last": 7})
    assert (ctx.policy.every_steps, ctx.policy.keep_last) == (5, 7)


BAD = {
    "malformed": ("{every_steps: 5", "is not valid JSON"),
    "truncated": ('{"every_steps": ', "is not valid JSON"),
    "a-list": ("[5]", "holds '[5]', not a JSON object"),
    "a-number": ("5", "holds '5', not a JSON object"),
    "unknown-key": ('{"evry_steps": 5}', "'evry_steps'. Did you mean 'every_steps'"),
}


@pytest.mark.parametrize(("value", "expected"), BAD.values(), ids=list(BAD))
def test_a_bad_value_is_one_line_naming_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str, expected: str
) -> None:
    monkeypatch.setenv(CHECKPOINT_ENV, value)
    with pytest.raises(TrainConfigError) as info:
        run_context(tmp_path)
    message = str(info.value)
    assert expected in message and f"${CHECKPOINT_ENV}" in message, message
    assert "\n" not in message and len(message) < 300, message
    if "unknown" not in message:
        assert "set it to a JSON object" in message and "or unset it" in message, message
