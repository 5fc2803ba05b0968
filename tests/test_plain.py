"""The machine's plain frames in C (analyzer/timeline/plain.py, _plain.c) against the Python
transitions: on the same rows, the same records in the same order and the same state after every
row, and where the C twin does not take a row, no change at all."""

import gc
import os
import sys
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer import columns, schema
from analyzer.ingest import decode
from analyzer.timeline import INPUT_COLUMNS, connection, state
from analyzer.timeline.plain import Row
from analyzer.timeline.connection import ConnectionTimeline, TimelineInputError

from .conftest import CORPUS, ROOT, check_built, needs_built
from .test_corpus import POSITIVE
from .test_timeline import EXAMPLES, SETTINGS, renumbered, valid_traffic
from .variants import VARIANTS

C_FEED = connection._plain_feed
pytestmark = needs_built(C_FEED is not None, "analyzer.timeline._plain is not built")


def doc(timeline: ConnectionTimeline) -> dict:
    return state.to_doc({"timeline": timeline})


class Twins:
    """Two machines per connection fed the same rows: one the Python way only, one through the C
    twin first. `every_row`: compare their whole state after each row (quadratic: small data)."""

    def __init__(self, every_row: bool):
        self.every_row = every_row
        self.machines: dict[str, tuple[ConnectionTimeline, ConnectionTimeline]] = {}
        self.by_python, self.by_c = [], []
        self.compared = 0   # records compared so far
        self.taken = Counter()

    def feed(self, row: dict, c_row=None) -> None:
        """`c_row`: what the C twin's machine is fed instead (a Row of the same row, say)."""
        c_row = row if c_row is None else c_row
        connection_id = row["connection_id"]
        if connection_id not in self.machines:
            self.machines[connection_id] = (
                ConnectionTimeline(connection_id, row.get("agent_id"), self.by_python.append),
                ConnectionTimeline(connection_id, row.get("agent_id"), self.by_c.append))
        python, c = self.machines[connection_id]
        before = doc(c) if self.every_row else None
        try:
            python.python_feed(row)
        except TimelineInputError:
            assert not C_FEED(c, c_row)  # the caller's fault: the C twin leaves it to Python
            assert doc(c) == doc(python) or not self.every_row
            raise
        taken = C_FEED(c, c_row)
        self.taken[(row.get("direction"), row.get("method"), taken)] += 1
        if not taken:
            if self.every_row:
                assert doc(c) == before, f"the C twin declined row {row} but changed the state"
            c.python_feed(c_row)
        compared, self.compared = self.compared, len(self.by_python)
        assert self.by_c[compared:] == self.by_python[compared:] and len(self.by_c) == len(self.by_python), \
            f"records differ after row {row}"
        if self.every_row:
            assert doc(c) == doc(python), f"state differs after row {row}"

    def end(self) -> None:
        for python, c in self.machines.values():
            assert doc(c) == doc(python)
            python.end()
            c.end()
        assert self.by_c == self.by_python

    def taken_share(self) -> float:
        return sum(n for (_, _, taken), n in self.taken.items() if taken) / max(1, sum(self.taken.values()))


def run_twins(rows, every_row: bool, as_rows: bool = False) -> Twins:
    """`as_rows`: the C twin's machine is fed the rows as the pass makes them of Arrow batches
    (columns.batch_rows: Rows, analyzer/_row.h, read in place by _plain.c), the Python one the
    dicts they equal."""
    twins = Twins(every_row)
    if as_rows:
        for row in arrow_rows(rows):
            twins.feed(dict(row), row)
    else:
        for row in rows:
            twins.feed(row)
    twins.end()
    return twins


def arrow_rows(rows: list[dict]) -> list:
    """The rows through an Arrow table of their frames columns (schema.FRAMES' types; a generator's
    own keys left out) and back, as Rows."""
    names = dict.fromkeys(name for row in rows for name in row if name in schema.FRAMES.names)
    table = pa.Table.from_pylist(rows, schema=pa.schema([schema.FRAMES.field(name) for name in names]))
    made = columns.batch_rows(table)
    assert type(made) is list and all(type(row) is Row for row in made), "the C loop did not take the rows"
    return made


def capture_rows(path: str) -> list[dict]:
    parts = []
    decode(path, parts.append)
    frames = pa.concat_tables(parts).select(INPUT_COLUMNS)
    return frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist()


def test_built_in_ci():
    check_built(C_FEED is not None, "analyzer.timeline._plain is not built")


@SETTINGS
@given(st.data())
def test_random_traffic_and_its_damaged_variants(data):
    traffic = valid_traffic(data)
    rows = traffic.conv.rows
    variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    if VARIANTS[variant] is not None:
        rows = VARIANTS[variant](data, rows)
    run_twins(renumbered(rows), every_row=True, as_rows=data.draw(st.booleans(), label="as Rows"))


@pytest.mark.parametrize("as_rows", [False, True], ids=["dicts", "Rows"])
@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_the_lab_examples(capture, as_rows):
    twins = run_twins(capture_rows(capture), every_row=False, as_rows=as_rows)
    assert twins.by_c, "no records: nothing compared"


@pytest.mark.parametrize("name", POSITIVE)
def test_the_public_corpus(name):
    run_twins(capture_rows(os.path.join(CORPUS, name)), every_row=False)


def test_the_examples_plain_frames_are_taken():
    """The C twin is not idle: across the examples it takes every kind of row it is for."""
    taken = Counter()
    for capture in EXAMPLES:
        for (direction, method, was_taken), n in run_twins(capture_rows(capture), every_row=False).taken.items():
            if was_taken:
                taken[(direction, method)] += n
    assert {("to_client", "basic.deliver"), ("to_broker", "basic.ack"), ("to_broker", "basic.publish"),
            ("to_client", "basic.ack")} <= set(taken)


def test_busy_generated_traffic_goes_through_c():
    """The bench generator's traffic (a hot consumer channel, confirm publishers, auto-ack and
    transactional channels, requeues, closes with deliveries unacked): equal, and nearly every
    frame taken by the C twin, which is what it is for."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import pass_cpu
    from frames_generator import Params
    table, _ = pass_cpu.pass_input(Params(frames=30_000, hot_deliveries=8_000))
    rows = [row for row in table.select(INPUT_COLUMNS).to_pylist() if row["seq"] != pass_cpu.HEADER_SEQ]
    twins = run_twins(rows, every_row=False, as_rows=True)   # as the pass feeds them
    assert len(twins.by_c) > 20_000
    assert twins.taken_share() > 0.9, twins.taken
    # The records of plain values it makes stay out of the cyclic collector's walks (_untrack.h).
    assert not any(map(gc.is_tracked, twins.by_c))


def test_rows_it_declines():
    """Rows of the kinds it takes, but not plain: each left to Python with nothing changed."""
    base = [{"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.open"},
            {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "channel.open-ok"},
            {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "basic.consume",
             "queue": "q", "consumer_tag": "ct", "no_ack": False},
            {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "basic.consume-ok",
             "consumer_tag": "ct"},
            {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "basic.deliver",
             "consumer_tag": "ct", "delivery_tag": 1}]
    declined = [
        {"direction": "to_client", "channel": 1, "method": "basic.deliver", "consumer_tag": "ct", "delivery_tag": 1},
        {"direction": "to_client", "channel": 2, "method": "basic.deliver", "consumer_tag": "ct", "delivery_tag": 1},
        {"direction": "to_client", "channel": True, "method": "basic.deliver", "consumer_tag": "ct", "delivery_tag": 2},
        {"direction": "to_client", "channel": 1, "method": "basic.deliver", "consumer_tag": "ct", "delivery_tag": 2.0},
        {"direction": "to_client", "channel": 1, "method": "basic.deliver", "consumer_tag": "ct", "delivery_tag": 2,
         "malformed": True},
        {"direction": "to_broker", "channel": 1, "method": "basic.ack", "delivery_tag": 5},
        {"direction": "to_broker", "channel": 1, "method": "basic.ack", "delivery_tag": 0, "multiple": True},
        {"direction": "to_broker", "channel": 1, "method": "basic.ack", "delivery_tag": 2**64},
        {"direction": "to_client", "channel": 1, "method": "basic.ack", "delivery_tag": 1},
        {"direction": "sideways", "channel": 1, "method": "basic.ack", "delivery_tag": 1},
    ]
    # The same frames once the channel (or its connection) is closing: its close decides them.
    plain = [{"direction": "to_client", "channel": 1, "method": "basic.deliver", "consumer_tag": "ct",
              "delivery_tag": 2},
             {"direction": "to_broker", "channel": 1, "method": "basic.ack", "delivery_tag": 1},
             {"direction": "to_broker", "channel": 1, "method": "basic.publish", "exchange": "x"}]
    closes = [{"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.close"},
              {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "channel.close"},
              {"connection_id": "c", "direction": "to_broker", "channel": 0, "method": "connection.close"}]
    cases = [(base, extra) for extra in declined] + [(base + [close], extra) for close in closes for extra in plain]
    for rows, extra in cases:
        timeline = ConnectionTimeline("c", None, [].append)
        for row in renumbered(rows):
            timeline.feed(row)
        row = {"connection_id": "c", "seq": 100, "ts_ns": timeline.last_ts_ns + 1, **extra}
        before = doc(timeline)
        assert not C_FEED(timeline, row), (rows[-1], extra)
        assert doc(timeline) == before
    for extra in plain:  # and without the close, each is taken
        timeline = ConnectionTimeline("c", None, [].append)
        for row in renumbered(base):
            timeline.feed(row)
        assert C_FEED(timeline, {"connection_id": "c", "seq": 100, "ts_ns": timeline.last_ts_ns + 1, **extra}), extra
    not_a_dict = type("Row", (dict,), {})(connection_id="c", seq=100, ts_ns=1, direction="to_broker", channel=1,
                                           method="basic.ack", delivery_tag=1)
    assert not C_FEED(timeline, not_a_dict)


C_FEED_ROWS = connection._plain_feed_rows


def test_feed_rows_is_feed_on_each_row_and_stops_where_feed_declines():
    """feed_rows(timeline, rows, start, stop) against feed row by row on the bench generator's
    traffic: the same records and state, stopping exactly at the first row feed declines; and it
    stops at a row of another connection, a row that is not a dict and at `stop`, feeding none."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import pass_cpu
    from frames_generator import Params
    table, _ = pass_cpu.pass_input(Params(frames=6_000, hot_deliveries=2_000))
    rows = [row for row in table.select(INPUT_COLUMNS).to_pylist() if row["seq"] != pass_cpu.HEADER_SEQ]
    first = rows[0]["connection_id"]
    rows = [row for row in rows if row["connection_id"] == first]
    one, many = [], []
    by_row = ConnectionTimeline(first, rows[0].get("agent_id"), one.append)
    by_rows = ConnectionTimeline(first, rows[0].get("agent_id"), many.append)
    at, stops = 0, 0
    while at < len(rows):
        done = C_FEED_ROWS(by_rows, rows, at, len(rows))
        for row in rows[at:done]:
            assert C_FEED(by_row, row)
        if done < len(rows):
            stops += 1
            assert not C_FEED(by_row, rows[done])
            by_row.python_feed(rows[done])
            by_rows.python_feed(rows[done])
            done += 1
        at = done
        assert doc(by_rows) == doc(by_row) and many == one
    assert len(one) > 2_000 and stops, "nothing compared"

    def fed_to(end: int) -> ConnectionTimeline:
        timeline = ConnectionTimeline(first, rows[0].get("agent_id"), [].append)
        for row in rows[:end]:
            timeline.feed(row)
        return timeline

    plain = next(at for at in range(len(rows)) if C_FEED_ROWS(fed_to(at), rows, at, at + 3) == at + 3)
    timeline = fed_to(plain)
    assert C_FEED_ROWS(timeline, rows, plain, plain) == plain and doc(timeline) == doc(fed_to(plain))
    stranger = dict(rows[plain + 1], connection_id="other")
    not_a_dict = type("Row", (dict,), {})(rows[plain + 1])
    for odd in (stranger, not_a_dict):
        timeline = fed_to(plain)
        before = doc(timeline)
        assert C_FEED_ROWS(timeline, [odd, rows[plain]], 0, 2) == 0 and doc(timeline) == before
        assert C_FEED_ROWS(timeline, [rows[plain], odd, rows[plain + 1]], 0, 3) == 1
        assert doc(timeline) == doc(fed_to(plain + 1))

    # `since_ns` (a carried connection's bucket): a row older than it stops the run, untouched.
    later = next(at for at in range(plain + 1, plain + 3) if rows[at]["ts_ns"] > rows[plain]["ts_ns"])
    timeline = fed_to(plain)
    assert C_FEED_ROWS(timeline, rows, plain, plain + 3, rows[later]["ts_ns"]) == plain
    assert doc(timeline) == doc(fed_to(plain))
    assert C_FEED_ROWS(timeline, rows, plain, plain + 3, rows[plain]["ts_ns"]) == plain + 3
    assert doc(timeline) == doc(fed_to(plain + 3))
    assert C_FEED_ROWS(fed_to(plain), rows, plain, plain + 3, None) == plain + 3
    with pytest.raises(TypeError):
        C_FEED_ROWS(fed_to(plain), rows, plain, plain + 3, float(rows[plain]["ts_ns"]))


@pytest.mark.parametrize("advance_every", [1, 7, 4096])
def test_an_analysis_fed_runs_of_rows_equals_one_fed_row_by_row(advance_every):
    """ConnectionAnalysis.feed_from (the pass's loop: plain rows taken in runs, no Python call per
    row) against `feed` on each row: the same records, channel_metrics rows, findings and
    checkpoint, the advances and prunes falling on the same rows."""
    from analyzer.connection_analysis import ConnectionAnalysis, Settings
    from analyzer.timeline.carry import dump
    from analyzer.timeline.records import DEFAULT_OVERDUE_NS
    from analyzer.detectors.thresholds import Thresholds
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import pass_cpu
    from frames_generator import Params
    table, _ = pass_cpu.pass_input(Params(frames=20_000, hot_deliveries=6_000))
    rows = [row for row in table.select(INPUT_COLUMNS).to_pylist() if row["seq"] != pass_cpu.HEADER_SEQ]
    settings = Settings(10, DEFAULT_OVERDUE_NS, Thresholds())
    by_connection: dict[str, list] = {}
    for row in rows:
        by_connection.setdefault(row["connection_id"], []).append(row)
    compared = 0
    for connection_id, own in by_connection.items():
        results = []
        for runs in (False, True):
            records, metrics = [], []
            analysis = ConnectionAnalysis(connection_id, own[0].get("agent_id"), settings, records.append,
                                          metrics.extend, advance_every)
            at = 0
            while at < len(own):
                if runs:
                    at = analysis.feed_from(own, at, len(own))
                else:
                    analysis.feed(own[at])
                    at += 1
            done = analysis.finish({"connection_id": connection_id})
            results.append((records, metrics, done.raw_findings, done.checkpoint and dump(done.checkpoint),
                            analysis.rows, analysis.whole.rows, analysis.whole.pruned_to))
        assert results[1] == results[0]
        compared += len(results[0][0])
    assert compared > 10_000
