"""Random traffic's variants: one connection's frame rows as captures damage them (reordered
directions, a mid-stream start, bytes lost in one direction, bad acks and confirms thrown in).
Drawn with hypothesis `data`; used by every test that compares paths on random traffic."""

from hypothesis import strategies as st

from .test_timeline import _swappable


def swapped(data, rows):
    rows, i = list(rows), 0
    while i < len(rows) - 1:
        if _swappable(rows[i], rows[i + 1]) and data.draw(st.booleans()):
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
            i += 1
        i += 1
    return rows


def mid_stream(data, rows):
    cut = data.draw(st.integers(1, len(rows)), label="cut")
    head = [{"connection_id": rows[0]["connection_id"], "direction": d, "channel": 0, "method": "capture.midstream"}
            for d in ("to_client", "to_broker")]
    return head + rows[cut:]


def with_gap(data, rows):
    direction = data.draw(st.sampled_from(["to_broker", "to_client"]))
    start = data.draw(st.integers(1, len(rows)))
    kept = [row for i, row in enumerate(rows) if not (start <= i < start + 6 and row["direction"] == direction)]
    kept.insert(min(start, len(kept)), {"connection_id": rows[0]["connection_id"], "direction": direction,
                                        "channel": 0, "method": "capture.gap", "gap_bytes": 100})
    return kept


def with_bad_acks(data, rows):
    """Acks and confirms naming random tags on random channels, anywhere."""
    rows = list(rows)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(1, len(rows)))
        to_broker = data.draw(st.booleans())
        rows.insert(at, {"connection_id": rows[0]["connection_id"], "agent_id": "test",
                         "direction": "to_broker" if to_broker else "to_client", "channel": data.draw(st.integers(1, 3)),
                         "method": data.draw(st.sampled_from(["basic.ack", "basic.nack", "basic.reject"]
                                                             if to_broker else ["basic.ack", "basic.nack"])),
                         "delivery_tag": data.draw(st.integers(0, 8)), "multiple": data.draw(st.booleans()),
                         "requeue": data.draw(st.booleans())})
    return rows


VARIANTS = {"valid": None, "swapped": swapped, "mid_stream": mid_stream, "gap": with_gap, "bad_acks": with_bad_acks}
