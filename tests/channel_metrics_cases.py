"""What channel_metrics (analyzer/timeline/metrics.py) must give: a plain Python model of every
column (a loop over the timeline rows, bucket by bucket, straight from schema.CHANNEL_METRICS'
definitions), random traffic for it, and hand-built conversations with exact timings and the
values they must give. Used by test_channel_metrics_python.py."""

from collections import defaultdict

import pyarrow as pa
from hypothesis import strategies as st

from analyzer import schema
from analyzer.rows import dicts_to_table

from .test_timeline import T0, Conv, ValidTraffic

SECOND = 1_000_000_000
NEVER = 2**63 - 1
COUNTS = ("deliveries", "redeliveries", "deliveries_unknown", "acks", "nacks", "rejects", "requeues",
          "publishes", "returns", "publishes_unknown", "confirms", "confirm_nacks", "lost")


# -- the model: a plain loop over the timeline rows, bucket by bucket --------------------------------------

def _settled_at(item):
    """(ts, seq) an item stops being outstanding, never before its own row; None: still open."""
    if item["settle_ts_ns"] is None:
        return None
    return max((item["settle_ts_ns"], item["settle_seq"]), (item["ts_ns"], item["seq"]))


def _outstanding_at(items, t):
    """Items outstanding at the end of everything before instant t: (ts, seq) of each."""
    return [start for start, end in items if start[0] < t and (end is None or end[0] >= t)]


def _outstanding_after(items, instant):
    return sum(1 for start, end in items if start <= instant and (end is None or end > instant))


def expected_metrics(tables: dict[str, pa.Table], bucket_seconds: int) -> list[dict]:
    size = bucket_seconds * SECOND
    incarnations = defaultdict(lambda: {"deliveries": [], "publishes": [], "channels": []})
    for name in ("deliveries", "publishes", "channels"):
        for row in tables[name].to_pylist():
            key = (row["connection_id"], row["agent_id"], row["channel"], row["incarnation"])
            incarnations[key][name].append(row)
    out = []
    for key, inc in incarnations.items():
        out += _expected_incarnation(key, inc["deliveries"], inc["publishes"], inc["channels"], size, bucket_seconds)
    return out


def _expected_incarnation(key, deliveries, publishes, channels, size, bucket_seconds):
    unacked = [((d["ts_ns"], d["seq"]), _settled_at(d)) for d in deliveries
               if d["no_ack"] is False and d["outcome"] != "unknown"]
    unconfirmed = [((p["ts_ns"], p["seq"]), _settled_at(p)) for p in publishes
                   if p["mode"] == "confirm" and p["outcome"] != "unknown"]
    happened = [(x["ts_ns"], x["seq"]) for x in deliveries + publishes]
    happened += [_settled_at(x) for x in deliveries + publishes if _settled_at(x) is not None]
    observed_until = None
    for c in channels:
        happened.append((c["open_ts_ns"], c["open_seq"]))
        if c["end_ts_ns"] is not None:
            happened.append((c["end_ts_ns"], c["end_seq"]))
        elif c["observed_until_ts_ns"] is not None:
            happened.append((c["observed_until_ts_ns"], NEVER))
            observed_until = c["observed_until_ts_ns"]
    by_bucket = defaultdict(list)
    for instant in happened:
        by_bucket[instant[0] - instant[0] % size].append(instant)
    rows = []
    for start in range(min(by_bucket), max(by_bucket) + size, size):
        end = start + size
        unacked_now, unconfirmed_now = _outstanding_at(unacked, end), _outstanding_at(unconfirmed, end)
        if start not in by_bucket and not unacked_now and not unconfirmed_now:
            continue
        as_of = end if observed_until is None else min(end, observed_until)
        instants = sorted(set(by_bucket[start]))
        row = {"connection_id": key[0], "agent_id": key[1], "channel": key[2], "incarnation": key[3],
               "bucket_start_ns": start, "bucket_seconds": bucket_seconds, "as_of_ns": as_of}
        for name, items, now in (("unacked", unacked, unacked_now), ("unconfirmed", unconfirmed, unconfirmed_now)):
            oldest = min(now, default=None)
            row[name] = len(now)
            row[name + "_max"] = max([len(_outstanding_at(items, start))]
                                     + [_outstanding_after(items, i) for i in instants])
            row[f"oldest_{name}_age_ns"] = None if oldest is None else as_of - oldest[0]
            row[f"oldest_{name}_seq"] = None if oldest is None else oldest[1]
        delivered = [d for d in deliveries if d["method"] == "basic.deliver" and d["ts_ns"] < end]
        last = max(delivered, key=lambda d: (d["ts_ns"], d["seq"]), default={})
        row["consumer_prefetch"], row["channel_prefetch"] = last.get("consumer_prefetch"), last.get("channel_prefetch")

        def arrived(items, test):
            return sum(1 for x in items if start <= x["ts_ns"] < end and test(x))

        def settled(items, test):
            return sum(1 for x in items if _settled_at(x) is not None and start <= _settled_at(x)[0] < end and test(x))

        row.update(
            deliveries=arrived(deliveries, lambda d: True),
            redeliveries=arrived(deliveries, lambda d: d["redelivered"] is True),
            deliveries_unknown=arrived(deliveries, lambda d: d["outcome"] == "unknown"),
            acks=settled(deliveries, lambda d: d["outcome"] == "ack"),
            nacks=settled(deliveries, lambda d: d["outcome"] == "nack"),
            rejects=settled(deliveries, lambda d: d["outcome"] == "reject"),
            requeues=settled(deliveries, lambda d: d["outcome"] in ("nack", "reject") and d["requeue"] is True),
            publishes=arrived(publishes, lambda p: True),
            returns=arrived(publishes, lambda p: p["return_seq"] is not None),
            publishes_unknown=arrived(publishes, lambda p: p["outcome"] == "unknown"),
            confirms=settled(publishes, lambda p: p["outcome"] == "acked"),
            confirm_nacks=settled(publishes, lambda p: p["outcome"] == "nacked"),
            lost=settled(publishes, lambda p: p["outcome"] == "lost"))
        rows.append(row)
    return rows


def in_order(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda x: (x["connection_id"], x["agent_id"] is None, x["agent_id"] or "",
                                       x["channel"], x["incarnation"], x["bucket_start_ns"]))


def as_table(rows: list[dict]) -> pa.Table:
    return dicts_to_table(rows, schema.CHANNEL_METRICS, schema.CHANNEL_METRIC_TIMESTAMPS,
                          schema.CHANNEL_METRIC_DATE_FROM)


def at(conv: Conv, seconds: float) -> Conv:
    """The conversation's next row comes `seconds` after T0 (a 10 s boundary)."""
    conv.ts = T0 + round(seconds * SECOND) - 1_000_000
    return conv


def by_second(rows) -> dict[float, dict]:
    return {(x["bucket_start_ns"] - T0) / SECOND: x for x in rows}


# -- random traffic against the model ------------------------------------------------------------------

# Steps between rows, in buckets: rows land on bucket boundaries often, or 1 ms before one.
STEPS = st.sampled_from([0, 0, 0.5, 1, 1, 1, 2, 3.7])
JITTER_NS = st.sampled_from([0, 0, 0, 0, 0, -1_000_000])


def damaged(data, rows):
    """As test_timeline does: sometimes the capture starts mid-stream, or loses bytes of one direction."""
    damage = data.draw(st.sampled_from(["none", "none", "mid-stream", "gap"]), label="damage")
    if damage == "mid-stream":
        cut = data.draw(st.integers(1, len(rows)), label="cut")
        return [{"direction": d, "channel": 0, "method": "capture.midstream"} for d in ("to_client", "to_broker")] \
            + rows[cut:]
    if damage == "gap":
        direction = data.draw(st.sampled_from(["to_broker", "to_client"]), label="direction")
        start = data.draw(st.integers(0, len(rows) - 1), label="start")
        end = data.draw(st.integers(start, min(len(rows), start + 12)), label="end")
        dropped = {i for i in range(start, end) if rows[i]["direction"] == direction
                   and not rows[i]["method"].startswith("tcp.")}
        if dropped:
            after = next((i for i in range(max(dropped) + 1, len(rows)) if rows[i]["direction"] == direction), len(rows))
            gap = {"direction": direction, "channel": 0, "method": "capture.gap", "gap_bytes": 100}
            return [row for i, row in enumerate(rows[:after]) if i not in dropped] + [gap] + rows[after:]
    return rows


def connection(data, connection_id, agent_id, bucket_seconds):
    traffic = ValidTraffic(data.draw)
    for _ in range(data.draw(st.integers(1, 150), label="steps")):
        traffic.step()
    traffic.end()
    return timed(data, damaged(data, [dict(row) for row in traffic.conv.rows]), connection_id, agent_id,
                 bucket_seconds)


def timed(data, rows, connection_id, agent_id, bucket_seconds):
    """Rows renumbered, with times that often land on bucket boundaries or just before one."""
    steps = data.draw(st.lists(st.tuples(STEPS, JITTER_NS), min_size=len(rows), max_size=len(rows)), label="times")
    aligned, ts, out = T0, T0, []
    for i, (row, (step, jitter)) in enumerate(zip(rows, steps)):
        aligned += round(step * bucket_seconds * SECOND)
        ts = max(ts, aligned + jitter)
        out.append(dict(row, connection_id=connection_id, agent_id=agent_id, seq=i + 1, ts_ns=ts))
    return out


# -- hand-built cases ------------------------------------------------------------------------------------
# Each case is one connection, 10 s buckets; `hand_built_rows` runs them all at once.

CASES = {}


def case(write):
    CASES[write.__name__] = write
    return write


@case
def boundary(conv):
    conv.open(1)
    conv.consume(1)
    at(conv, 10).deliver(1, 1)        # opens bucket 10: bucket 0 ends with nothing unacked
    at(conv, 20).ack(1, 1)            # opens bucket 20: still unacked at the end of bucket 10


@case
def idle_for_days(conv):
    conv.open(1)
    conv.consume(1)
    conv.deliver(1, 1)
    conv.ack(1, 1)
    at(conv, 3 * 86_400 + 5).c(0, "heartbeat")  # three days later, still open, nothing outstanding
    conv.deliver(1, 2)
    conv.ack(1, 2)


@case
def unacked_for_a_minute(conv):
    conv.open(1)
    conv.consume(1)
    conv.deliver(1, 1)
    at(conv, 61).ack(1, 1)


@case
def open_at_end_of_data(conv):
    conv.open(1)
    conv.c(1, "basic.qos", prefetch_count=5, prefetch_global=False)
    conv.consume(1)
    at(conv, 5).deliver(1, 1)
    at(conv, 33).c(0, "heartbeat")    # the last row of the data


@case
def lost_publishes(conv):
    conv.open(1)
    conv.c(1, "confirm.select", nowait=False)
    conv.b(1, "confirm.select-ok")
    for msg in ("p1", "p2", "p3"):
        conv.publish(1, msg, mandatory=msg == "p3")
    conv.b(1, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="", routing_key="q",
           message_id="p3", message_identity="id:p3")
    at(conv, 12).confirm(1, 1)
    at(conv, 25).close(1)


@case
def multiple_ack(conv):
    conv.open(1)
    conv.consume(1)
    for tag in range(1, 6):
        conv.deliver(1, tag, redelivered=tag == 2)
    at(conv, 15).ack(1, 5, multiple=True)
    at(conv, 16).ack(1, 0, multiple=True)  # nothing left: settles nothing


@case
def nacks_in_a_transaction(conv):
    conv.open(1)
    conv.c(1, "tx.select")
    conv.b(1, "tx.select-ok")
    conv.consume(1)
    for tag in range(1, 5):
        conv.deliver(1, tag)
    conv.ack(1, 2, multiple=True, method="basic.nack", requeue=True)
    conv.ack(1, 3, method="basic.reject", requeue=False)
    at(conv, 10).c(1, "tx.commit")    # the nack and reject take effect here
    conv.b(1, "tx.commit-ok")


@case
def unknown_after_a_gap(conv):
    conv.open(1)
    conv.consume(1)
    conv.deliver(1, 1)
    at(conv, 20).c(0, "capture.gap", gap_bytes=100)  # the ack may be in the missing bytes
    at(conv, 95).c(0, "heartbeat")


def hand_built_rows(metrics) -> dict:
    """Each case's rows by bucket (seconds after T0), and its conversation: `metrics` turns the
    timeline tables of every case (one connection each) into rows, 10 s buckets."""
    from analyzer.timeline import replay, to_tables
    convs = {}
    for name, write in CASES.items():
        convs[name] = conv = Conv(connection_id=f"10.0.0.1:40000>10.0.0.2:5672@{name}", start=T0 - 1_000_000)
        write(conv)
    rows = sorted((row for conv in convs.values() for row in conv.rows), key=lambda x: (x["connection_id"], x["seq"]))
    got = metrics(to_tables(replay(rows)))
    return {name: (by_second([x for x in got if x["connection_id"] == conv.id]), conv) for name, conv in convs.items()}


# The values each hand-built case must give: name -> check(hand_built_rows(...)).
HAND_CHECKS = {}


def hand_check(check):
    HAND_CHECKS[check.__name__] = check
    return check


@hand_check
def an_event_exactly_on_a_boundary_belongs_to_the_bucket_it_starts(hand_built):
    rows, _ = hand_built["boundary"]
    assert sorted(rows) == [0, 10, 20]
    assert (rows[0]["unacked"], rows[0]["unacked_max"], rows[0]["deliveries"]) == (0, 0, 0)
    assert (rows[10]["unacked"], rows[10]["deliveries"], rows[10]["oldest_unacked_age_ns"]) == (1, 1, 10 * SECOND)
    assert (rows[20]["unacked"], rows[20]["unacked_max"], rows[20]["acks"]) == (0, 1, 1)
    assert rows[20]["oldest_unacked_age_ns"] is None
    assert rows[20]["as_of_ns"] == T0 + 20 * SECOND  # the data ends at the ack
    assert rows[10]["bucket_start"].isoformat() == "2026-11-18T11:06:50+00:00" and rows[10]["date"] == "2026-11-18"


@hand_check
def a_long_open_channel_with_nothing_outstanding_has_no_rows_in_the_idle_middle(hand_built):
    rows, _ = hand_built["idle_for_days"]
    assert sorted(rows) == [0, 3 * 86_400]
    assert [(x["deliveries"], x["acks"], x["unacked"], x["unacked_max"]) for x in rows.values()] == \
        [(1, 1, 0, 1), (1, 1, 0, 1)]


@hand_check
def a_delivery_left_unacked_fills_every_bucket_until_it_is_settled(hand_built):
    rows, _ = hand_built["unacked_for_a_minute"]
    assert sorted(rows) == [0, 10, 20, 30, 40, 50, 60]
    assert [rows[s]["oldest_unacked_age_ns"] // SECOND for s in range(0, 60, 10)] == [9, 19, 29, 39, 49, 59]
    assert {rows[s]["deliveries"] + rows[s]["acks"] for s in range(10, 60, 10)} == {0}
    assert (rows[60]["unacked"], rows[60]["unacked_max"], rows[60]["acks"]) == (0, 1, 1)


@hand_check
def a_delivery_open_when_the_data_ends_is_unacked_up_to_the_end_and_no_further(hand_built):
    rows, _ = hand_built["open_at_end_of_data"]
    assert sorted(rows) == [0, 10, 20, 30]
    assert all(x["unacked"] == 1 for x in rows.values())
    assert (rows[20]["as_of_ns"], rows[20]["oldest_unacked_age_ns"]) == (T0 + 30 * SECOND, 25 * SECOND)
    assert (rows[30]["as_of_ns"], rows[30]["oldest_unacked_age_ns"]) == (T0 + 33 * SECOND, 28 * SECOND)
    assert (rows[0]["consumer_prefetch"], rows[0]["channel_prefetch"]) == (5, 0)
    assert rows[30]["consumer_prefetch"] == 5  # in force since the last delivery


@hand_check
def lost_publishes_are_unconfirmed_until_their_channel_closes(hand_built):
    rows, conv = hand_built["lost_publishes"]
    assert sorted(rows) == [0, 10, 20]
    assert [(rows[s]["unconfirmed"], rows[s]["unconfirmed_max"]) for s in (0, 10, 20)] == [(3, 3), (2, 3), (0, 2)]
    assert (rows[0]["publishes"], rows[0]["returns"], rows[10]["confirms"], rows[20]["lost"]) == (3, 1, 1, 2)
    assert rows[10]["oldest_unconfirmed_seq"] == next(x["seq"] for x in conv.rows if x.get("message_id") == "p2")
    assert rows[20]["oldest_unconfirmed_age_ns"] is None


@hand_check
def a_multiple_ack_settles_many_at_once(hand_built):
    rows, _ = hand_built["multiple_ack"]
    assert (rows[0]["deliveries"], rows[0]["redeliveries"], rows[0]["unacked"], rows[0]["unacked_max"]) == (5, 1, 5, 5)
    assert (rows[10]["acks"], rows[10]["unacked"], rows[10]["unacked_max"]) == (5, 0, 5)


@hand_check
def nacks_rejects_and_requeues_are_counted_when_they_take_effect(hand_built):
    rows, _ = hand_built["nacks_in_a_transaction"]
    assert (rows[0]["unacked"], rows[0]["nacks"], rows[0]["rejects"]) == (4, 0, 0)
    assert (rows[10]["unacked"], rows[10]["nacks"], rows[10]["rejects"], rows[10]["requeues"]) == (1, 2, 1, 2)


@hand_check
def deliveries_whose_outcome_is_unknown_never_count_as_unacked(hand_built):
    rows, _ = hand_built["unknown_after_a_gap"]
    assert sorted(rows) == [0, 90]  # no row at the gap: an unknown outcome has no time
    assert (rows[0]["deliveries"], rows[0]["deliveries_unknown"]) == (1, 1)
    assert all(x["unacked"] == x["unacked_max"] == 0 for x in rows.values())
