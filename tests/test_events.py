from datetime import timezone

import pytest

from tgnb.events import PREEMPTION_NOTIFIED, Event, dedupe, format_time, parse_time


def test_lifecycle_record_round_trip() -> None:
    rec = {
        "node_id": "gpu-preemptible-dp-1",
        "reason": PREEMPTION_NOTIFIED,
        "message": "node will be reclaimed",
        "timestamp": "2026-11-29T10:00:00Z",
    }
    ev = Event.from_lifecycle(rec)
    assert ev.is_preemption and ev.node == "gpu-preemptible-dp-1"
    assert ev.time.tzinfo == timezone.utc
    assert Event.from_dict(ev.to_dict()) == ev


def test_dedupe_is_incremental() -> None:
    a = Event(parse_time("2026-11-29T10:00:01Z"), "cluster", "TogetherNodeAdded", node="n1")
    b = Event(parse_time("2026-11-29T10:00:00Z"), "cluster", PREEMPTION_NOTIFIED, node="n0")
    seen: set = set()
    assert dedupe([a, b], seen) == [b, a]
    assert dedupe([a, b], seen) == []
    assert format_time(a.time) == "2026-11-29T10:00:01Z"


FORMS = ["90", "90s", "1.5m", "15m", "2h", " 1d ", "3650d"]
BAD = ["0", "0s", "-5m", "1w", "\u0661h", "1_0s", "3651d", "2 hours", ""]


@pytest.mark.parametrize("text", FORMS + BAD)
def test_one_duration_grammar_for_the_magic_and_python(text: str) -> None:
    """``%tg events --since X`` (and ``--timeout``, ``--inactive-timeout``) and the Python API's
    ``since="X"`` read a duration the same way: the same forms taken, as the same age, and the
    same ones refused."""
    import argparse

    from tgnb.events import parse_since, utcnow
    from tgnb.notebook.commands.grammar import duration

    try:
        magic: float | None = duration(text).total_seconds()
    except argparse.ArgumentTypeError:
        magic = None
    try:
        start = parse_since(text)
        assert start is not None
        python: float | None = round((utcnow() - start).total_seconds())
    except ValueError:
        python = None
    assert (magic is None) == (text in BAD)
    assert python == (None if magic is None else round(magic))
