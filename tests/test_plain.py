"""The machine's plain frames in C (analyzer/timeline/plain.py, _plain.c) against the Python
transitions: on the same rows, the same records in the same order and the same state after every
row, and where the C twin does not take a row, no change at all."""

import os
import sys
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer.ingest import decode
from analyzer.timeline import INPUT_COLUMNS, connection, state
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

    def feed(self, row: dict) -> None:
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
            assert not C_FEED(c, row)  # the caller's fault: the C twin leaves it to Python
            assert doc(c) == doc(python) or not self.every_row
            raise
        taken = C_FEED(c, row)
        self.taken[(row.get("direction"), row.get("method"), taken)] += 1
        if not taken:
            if self.every_row:
                assert doc(c) == before, f"the C twin declined row {row} but changed the state"
            c.python_feed(row)
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


def run_twins(rows, every_row: bool) -> Twins:
    twins = Twins(every_row)
    for row in rows:
        twins.feed(row)
    twins.end()
    return twins


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
    run_twins(renumbered(rows), every_row=True)


@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_the_lab_examples(capture):
    twins = run_twins(capture_rows(capture), every_row=False)
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
    twins = run_twins(rows, every_row=False)
    assert len(twins.by_c) > 20_000
    assert twins.taken_share() > 0.9, twins.taken


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
