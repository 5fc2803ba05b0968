"""channel_metrics (analyzer/timeline/metrics.py): against the table the analysis stored for every
recorded example (the session's analysed lake), the plain model of channel_metrics_cases.py on
random traffic, the hand-built cases and two recorded captures (their exact values and the lab's
facts); streamed (rows out as they become final) equal to all at once; and an incremental run's
patched rows equal to one run."""

import json
import os
from collections import defaultdict

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.timeline import CHANNELS, INPUT_COLUMNS, Timelines, replay, replay_frames, to_tables
from analyzer.timeline import records as r
from analyzer.connection_analysis import Settings, carry_on_connection
from analyzer.timeline.carry import dump, load
from analyzer.timeline.metrics import ChannelMetrics, HorizonError, channel_metrics, to_table
from analyzer.timeline.metrics_stream import announce_opens, horizons, stream_metrics
from analyzer.detectors.thresholds import Thresholds

from .channel_metrics_cases import (HAND_CHECKS, SECOND, as_table, connection, expected_metrics, hand_built_rows,
                                    in_order, timed)
from .conftest import ROOT

ORDER = [("connection_id", "ascending"), ("agent_id", "ascending"), ("channel", "ascending"),
         ("incarnation", "ascending"), ("bucket_start_ns", "ascending")]


def table_rows(rows: list[dict]) -> list[dict]:
    """Rows as the stored table holds them (derived date and bucket_start included), in key order."""
    return in_order(to_table(rows).to_pylist())


def records_of(tables: dict[str, pa.Table]) -> list:
    """Timeline tables back into the records they were written from."""
    out = []
    for name, record_type in (("deliveries", r.Delivery), ("publishes", r.Publish), ("channels", r.ChannelFacts)):
        for row in tables[name].to_pylist():
            out.append(record_type(**{field: row[field] for field in record_type.__slots__}))
    return out


def assert_same_rows(got: list[dict], want: list[dict]) -> None:
    """Row for row, column by column (the first difference named, not a wall of dicts)."""
    assert [(x["connection_id"], x["channel"], x["incarnation"], x["bucket_start_ns"]) for x in got] == \
        [(x["connection_id"], x["channel"], x["incarnation"], x["bucket_start_ns"]) for x in want]
    for mine, theirs in zip(got, want):
        assert mine.keys() == theirs.keys()
        for column in theirs:
            assert mine[column] == theirs[column], (column, theirs)


def checked(tables: dict[str, pa.Table], bucket_seconds: int = 10) -> list[dict]:
    """channel_metrics of the timeline tables' records, after checking them against the model row
    for row."""
    got = table_rows(channel_metrics(records_of(tables), bucket_seconds))
    assert_same_rows(got, in_order(as_table(expected_metrics(tables, bucket_seconds)).to_pylist()))
    return got


# -- the stored table of every recorded example ----------------------------------------------------------

@pytest.fixture(scope="module")
def examples(analysed_examples):
    """The analysed lake's frames per connection (seq order) and its tables."""
    lake_dir, _report = analysed_examples
    frames = (lake.read_table(lake_dir, "frames", schema.FRAMES).select(INPUT_COLUMNS)
              .sort_by([("connection_id", "ascending"), ("seq", "ascending")]))
    by_connection = defaultdict(list)
    for row in frames.to_pylist():
        by_connection[row["connection_id"]].append(row)
    tables = {name: lake.read_table(lake_dir, name, table_schema) for name, table_schema in
              (("deliveries", schema.DELIVERIES), ("publishes", schema.PUBLISHES), ("channels", CHANNELS),
               ("channel_metrics", schema.CHANNEL_METRICS))}
    return by_connection, tables


def stored_rows(tables) -> list[dict]:
    return tables["channel_metrics"].sort_by(ORDER).to_pylist()


def test_every_example_streamed_through_the_machine_equals_the_stored_table(examples):
    by_connection, tables = examples
    assert len(by_connection) > 10 and tables["channel_metrics"].num_rows > 20  # the examples are all there
    streamed, replayed = [], []
    for rows in by_connection.values():
        records = []
        streamed += stream_metrics(rows, bucket_seconds=10, advance_every=1, records=records)
        replayed += channel_metrics(records, bucket_seconds=10)
    want = in_order(stored_rows(tables))
    assert_same_rows(table_rows(streamed), want)
    assert_same_rows(table_rows(replayed), want)


def test_every_example_from_the_stored_timeline_tables_equals_the_stored_table(examples):
    _, tables = examples
    assert_same_rows(table_rows(channel_metrics(records_of(tables), bucket_seconds=10)),
                     in_order(stored_rows(tables)))


# -- random traffic ----------------------------------------------------------------------------------------

def random_records(data, connections):
    bucket_seconds = data.draw(st.sampled_from([1, 10]), label="bucket_seconds")
    agents = data.draw(st.permutations(["a1", "", None]), label="agents")
    records = []
    for i in range(data.draw(connections, label="connections")):
        connection_id = f"10.0.0.1:4000{i % 2}>10.0.0.2:5672@1"
        records += replay(connection(data, connection_id, agents[i // 2 % 3], bucket_seconds))
    return records, bucket_seconds


# The model is quadratic (every item at every bucket end): fewer examples than the others.
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_traffic_equals_the_model(data):
    records, bucket_seconds = random_records(data, st.integers(1, 4))
    assert_same_rows(table_rows(channel_metrics(records, bucket_seconds)),
                     in_order(as_table(expected_metrics(to_tables(records), bucket_seconds)).to_pylist()))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_streamed_rows_equal_the_rows_of_all_records_at_once(data):
    """Every variant of traffic the timeline tests use: transactions, swapped directions, mid-stream
    starts, gaps, bad acks."""
    from .variants import VARIANTS
    from .test_timeline import valid_traffic
    bucket_seconds = data.draw(st.sampled_from([1, 10]), label="bucket_seconds")
    variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    rows = valid_traffic(data, transactions=data.draw(st.booleans())).conv.rows
    if VARIANTS[variant] is not None:
        rows = VARIANTS[variant](data, rows)
    rows = timed(data, rows, "10.0.0.1:40000>10.0.0.2:5672@1", "a1", bucket_seconds)
    records = []
    streamed = list(stream_metrics(rows, bucket_seconds, advance_every=data.draw(st.sampled_from([1, 3])),
                                   records=records))
    assert in_order(streamed) == channel_metrics(records, bucket_seconds)


def test_rows_come_out_before_the_data_ends_and_memory_follows_the_horizon():
    """A consumer acking promptly for ten minutes: every bucket's row is out before the data ends
    but the last ones, and what is kept at any time is a bucket or two, not the connection."""
    rows = prompt_consumer(messages=3000, gap_ns=200_000_000)
    timelines, metrics, out, records, kept = Timelines(), ChannelMetrics(10), [], [], []
    for row in rows:
        emitted = timelines.feed(row)
        records += emitted
        metrics.feed(emitted)
        timeline = timelines.connections[row["connection_id"]]
        announce_opens(metrics, timeline)
        out += metrics.advance(*horizons(timeline))
        kept.append(sum(len(inc.buckets) for inc in metrics.incarnations.values()))
    out_before_the_end = len(out)
    emitted = timelines.end_of_data()
    metrics.feed(emitted)
    out += metrics.finish()
    assert in_order(out) == channel_metrics(records + emitted, 10)
    assert len(out) == 61 and out_before_the_end >= 59  # 600 s in 10 s buckets, and the close's
    assert max(kept) <= 2


def test_a_delivery_nobody_acks_holds_back_its_own_channel_only():
    """Channel 1 sits on one delivery for ten minutes while channel 2 consumes promptly: channel 2's
    rows come out as it goes; channel 1's wait for the ack (its level and oldest item depend on it)."""
    from .test_timeline import Conv
    conv = Conv(connection_id="10.0.0.1:40000>10.0.0.2:5672@1", start=1_795_000_000_000_000_000)
    for channel in (1, 2):
        conv.open(channel)
        conv.consume(channel)
    conv.deliver(1, 1)
    for tag in range(1, 3001):
        conv.ts += 200_000_000
        conv.deliver(2, tag)
        conv.ack(2, tag)
    conv.ack(1, 1)
    rows = [{c: row.get(c) for c in INPUT_COLUMNS} for row in conv.rows]
    timelines, metrics, out, records = Timelines(), ChannelMetrics(10), [], []
    for row in rows:
        if row["channel"] == 1 and row["method"] == "basic.ack":
            before_the_ack = {channel: sum(1 for x in out if x["channel"] == channel) for channel in (1, 2)}
        emitted = timelines.feed(row)
        records += emitted
        metrics.feed(emitted)
        timeline = timelines.connections[row["connection_id"]]
        announce_opens(metrics, timeline)
        out += metrics.advance(*horizons(timeline))
    emitted = timelines.end_of_data()
    metrics.feed(emitted)
    out += metrics.finish()
    assert in_order(out) == channel_metrics(records + emitted, 10)
    assert before_the_ack == {1: 0, 2: 60}  # all but the bucket the data is in
    assert {channel: sum(1 for x in out if x["channel"] == channel) for channel in (1, 2)} == {1: 61, 2: 61}


def prompt_consumer(messages: int, gap_ns: int, start_ns: int = 1_795_000_000_000_000_000) -> list[dict]:
    from .test_timeline import Conv
    conv = Conv(connection_id="10.0.0.1:40000>10.0.0.2:5672@1", start=start_ns)
    conv.open(1)
    conv.consume(1)
    for tag in range(1, messages + 1):
        conv.ts += gap_ns
        conv.deliver(1, tag)
        conv.ack(1, tag)
    conv.close(1)
    return [{c: row.get(c) for c in INPUT_COLUMNS} for row in conv.rows]


def test_a_record_before_a_horizon_already_passed_is_refused():
    records = replay(prompt_consumer(messages=100, gap_ns=SECOND))
    deliveries = [x for x in records if type(x) is r.Delivery]
    metrics = ChannelMetrics(10)
    metrics.feed(deliveries[:50])
    assert metrics.advance(deliveries[60].ts_ns)  # the first buckets are final...
    with pytest.raises(HorizonError, match="before the horizon"):
        metrics.feed([deliveries[50]])  # ...so this one, earlier than promised, cannot be taken


# -- hand-built cases with exact values -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def hand_built():
    return hand_built_rows(checked)


@pytest.mark.parametrize("check", HAND_CHECKS.values(), ids=HAND_CHECKS.keys())
def test_hand_built_cases(hand_built, check):
    check(hand_built)


def test_bucket_seconds_must_be_whole_seconds():
    for bad in (0, -10, 2.5, "10", True):
        with pytest.raises(ValueError, match="bucket_seconds"):
            channel_metrics([], bucket_seconds=bad)


# -- recorded captures ----------------------------------------------------------------------------------

def test_recorded_captures(tmp_path):
    names, expected = {}, {}
    for scenario in ("clean_async_confirms", "redelivery_after_close"):
        capture = os.path.join(ROOT, "examples", scenario + ".pcapng")
        assert not ingest_file(capture, str(tmp_path)).unreadable
        with open(capture.replace(".pcapng", ".expected.json")) as f:
            expected[scenario] = json.load(f)
        names.update({port: name for name, port in expected[scenario]["facts"]["connections"].items()})
    connections = lake.read_table(str(tmp_path), "connections", schema.CONNECTIONS).to_pylist()
    name_of = {c["connection_id"]: names[c["client_port"]] for c in connections}
    tables = replay_frames(lake.read_table(str(tmp_path), "frames", schema.FRAMES))
    rows = checked(tables, bucket_seconds=1)

    def of(name):
        return [x for x in rows if name_of[x["connection_id"]] == name]

    def total(name, column):
        return sum(x[column] for x in of(name))

    facts = expected["clean_async_confirms"]["facts"]
    publisher, consumer = "lab-clean_async_confirms-publisher", "lab-clean_async_confirms-consumer"
    assert total(publisher, "publishes") == total(publisher, "confirms") == facts["publishes"] == 80
    assert total(consumer, "deliveries") == total(consumer, "acks") == facts["publishes"]
    assert 1 <= max(x["unconfirmed_max"] for x in of(publisher)) <= 20   # "at most 20 awaiting confirms"
    assert 1 <= max(x["unacked_max"] for x in of(consumer)) <= 100       # prefetch 100
    assert {x["consumer_prefetch"] for x in of(consumer) if x["deliveries"]} == {100}
    assert of(publisher)[-1]["unconfirmed"] == of(consumer)[-1]["unacked"] == 0
    assert total(publisher, "lost") + total(publisher, "confirm_nacks") + total(consumer, "nacks") == 0

    facts = expected["redelivery_after_close"]["facts"]
    first, second = "lab-redelivery_after_close-first-consumer", "lab-redelivery_after_close-second-consumer"
    assert total(first, "deliveries") == facts["delivered_first"]
    assert total(first, "acks") == facts["acked_before_close"]
    assert max(x["unacked_max"] for x in of(first)) == facts["delivered_first"]  # prefetch 10, all received first
    assert of(first)[-1]["unacked"] == 0  # the close sent the 7 back
    assert total(second, "redeliveries") == total(second, "acks") == 7
    assert total("lab-redelivery_after_close-producer", "publishes") == 10


# -- incremental runs ---------------------------------------------------------------------------------------

def patched_in_pieces(rows: list[dict], cuts: list[int], bucket_seconds: int) -> tuple[dict, int]:
    """The stored channel_metrics after one incremental run per piece (connection_analysis.py's
    CarriedAnalysis), each replacing the touched incarnations' rows from its boundary bucket on; and
    how many runs were carried."""
    run = Settings(bucket_seconds, r.DEFAULT_OVERDUE_NS, Thresholds())
    connection = {"connection_id": rows[0]["connection_id"]}
    stored, checkpoint, carried, ended = {}, None, 0, False
    for start, stop in zip([0, *cuts], [*cuts, len(rows)]):
        if start == stop:
            continue
        out = None if ended else carry_on_connection(checkpoint, rows[start:stop], run, connection)
        if out is None or out.done.fallback:  # analysed whole, as the Spark job does: every stored row replaced
            out = carry_on_connection(None, rows[:stop], run, connection)
            stored = {}
        done = out.done
        carried += done.boundary_ns is not None
        for key in [k for k in stored if (k[0], k[1]) in done.touched
                    and (done.boundary_ns is None or k[2] >= done.boundary_ns)]:
            del stored[key]
        for row in out.metrics:
            key = (row["channel"], row["incarnation"], row["bucket_start_ns"])
            assert key not in stored, key
            stored[key] = row
        ended = done.checkpoint is None  # no checkpoint once the connection ended: the next run is whole
        checkpoint = None if ended else load(dump(done.checkpoint))
    return stored, carried


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_an_incremental_run_patched_onto_the_last_equals_one_run(data):
    bucket_seconds = data.draw(st.sampled_from([1, 10]), label="bucket_seconds")
    rows = connection(data, "10.0.0.1:40000>10.0.0.2:5672@1", "a1", bucket_seconds)
    rows = [{c: row.get(c) for c in INPUT_COLUMNS} for row in rows]
    cuts = sorted(data.draw(st.lists(st.integers(1, len(rows)), max_size=5), label="cuts"))
    stored, _ = patched_in_pieces(rows, cuts, bucket_seconds)
    assert sorted(stored.values(), key=lambda x: (x["channel"], x["incarnation"], x["bucket_start_ns"])) == \
        channel_metrics(replay(rows), bucket_seconds)


def test_incremental_runs_are_carried_not_just_redone():
    rows = prompt_consumer(messages=400, gap_ns=SECOND // 4)
    stored, carried = patched_in_pieces(rows, list(range(50, len(rows), 50)), 10)
    assert carried >= 10
    assert sorted(stored.values(), key=lambda x: x["bucket_start_ns"]) == channel_metrics(replay(rows), 10)
