"""Checks made before any request: the preemptible target, GPU counts, names (pure functions)."""

from __future__ import annotations

import pytest

from tgnb.cloud.validate import check_gpus, check_name, check_target, nearest_multiples
from tgnb.errors import ValidationError


@pytest.mark.parametrize("value", [0, 8, 16, 64])
def test_good_targets_pass(value: int) -> None:
    assert check_target(value, "proj-1") == value


def test_zero_needs_no_project() -> None:
    assert check_target(0, None) == 0


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (12, "must be a multiple of 8, got 12: try 8 or 16"),
        (3, "try 0 or 8"),
        (20, "try 16 or 24"),
        (-8, "must be >= 0, got -8"),
        ("16", "pass the number 16, not the string '16'"),
        (True, "must be an integer number of GPUs, got bool"),
        (16.0, "got float 16.0"),
        (None, "got NoneType"),
    ],
)
def test_bad_targets_say_the_fix(value: object, fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_target(value, "proj-1")
    msg = str(info.value)
    assert fragment in msg
    assert "\n" not in msg


def test_positive_target_needs_a_project() -> None:
    with pytest.raises(ValidationError, match="needs a project: set TOGETHER_PROJECT_ID"):
        check_target(16, None)
    with pytest.raises(ValidationError):
        check_target(8, "")


def test_nearest_multiples() -> None:
    assert nearest_multiples(12) == (8, 16)
    assert nearest_multiples(1) == (0, 8)
    assert nearest_multiples(17) == (16, 24)


@pytest.mark.parametrize(
    ("value", "fragment"), [(4, "try 8 or 16"), (12, "try 8 or 16"), (0, "try 8 or 16")]
)
def test_standard_gpus(value: int, fragment: str) -> None:
    assert check_gpus(8) == 8
    with pytest.raises(ValidationError, match=fragment):
        check_gpus(value)


def test_names() -> None:
    assert check_name("  train ") == "train"
    for bad in ("", "   ", None, 3):
        with pytest.raises(ValidationError):
            check_name(bad)
