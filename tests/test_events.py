from datetime import timezone

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
