"""channel_metrics on real Spark: against a plain Python model of the metrics on random traffic,
on hand-built conversations with exact timings, and on recorded lab captures (the model, traffic
and cases: channel_metrics_cases.py)."""

import json
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.timeline import CHANNELS, replay, replay_frames, to_tables
from spark_jobs.channel_metrics import channel_metrics
from spark_jobs.types import spark_schema

from .channel_metrics_cases import HAND_CHECKS, as_table, connection, expected_metrics, hand_built_rows, in_order
from .conftest import ROOT


# -- running the job ---------------------------------------------------------------------------------------

INPUTS = (("deliveries", schema.DELIVERIES), ("publishes", schema.PUBLISHES), ("channels", CHANNELS))


def spark_metrics(spark, tables: dict[str, pa.Table], bucket_seconds: int = 10) -> list[dict]:
    frames = [spark.createDataFrame(tables[name], schema=spark_schema(table_schema)) for name, table_schema in INPUTS]
    result = channel_metrics(*frames, bucket_seconds=bucket_seconds)
    assert [(f.name, f.dataType) for f in result.schema] == \
        [(f.name, f.dataType) for f in spark_schema(schema.CHANNEL_METRICS)]
    return in_order(result.toArrow().to_pylist())


def checked(spark, tables, bucket_seconds=10) -> list[dict]:
    """The job's rows, after checking them against the model row for row."""
    got = spark_metrics(spark, tables, bucket_seconds)
    assert got == in_order(as_table(expected_metrics(tables, bucket_seconds)).to_pylist())
    return got


# -- random traffic against the model ------------------------------------------------------------------

@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_traffic_matches_the_model_row_for_row(spark, data):
    # Several connections per Spark run; the same connection id under different agents (one of
    # them null) must stay apart.
    bucket_seconds = data.draw(st.sampled_from([1, 10]), label="bucket_seconds")
    agents = data.draw(st.permutations(["a1", "", None]), label="agents")
    records = []
    for i in range(data.draw(st.integers(3, 6), label="connections")):
        connection_id = f"10.0.0.1:4000{i % 2}>10.0.0.2:5672@1"
        records += replay(connection(data, connection_id, agents[i // 2 % 3], bucket_seconds))
    checked(spark, to_tables(records), bucket_seconds)


# -- hand-built cases (channel_metrics_cases.py), all through one Spark run -----------------------------------

@pytest.fixture(scope="module")
def hand_built(spark):
    return hand_built_rows(lambda tables: checked(spark, tables))


@pytest.mark.parametrize("check", HAND_CHECKS.values(), ids=HAND_CHECKS.keys())
def test_hand_built_cases(hand_built, check):
    check(hand_built)


def test_bucket_seconds_must_be_whole_seconds(spark):
    empty = [spark.createDataFrame([], spark_schema(s)) for _, s in INPUTS]
    for bad in (0, -10, 2.5):
        with pytest.raises(ValueError, match="bucket_seconds"):
            channel_metrics(*empty, bucket_seconds=bad)


# -- recorded captures ----------------------------------------------------------------------------------

def test_recorded_captures(spark, tmp_path):
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
    rows = checked(spark, tables, bucket_seconds=1)

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
