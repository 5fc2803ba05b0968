"""The detectors (spark_jobs.detectors) on real Spark: the recorded lab examples and the public
corpus, ingested by the real agent and run through the reference timelines; and hand-built
timeline rows on both sides of every threshold.

Lab captures last seconds, so everything here runs with the lab-scale thresholds of
tests/findings_check.py (a delivery unacked 1.2 s is "stuck" in the lab; in production the
default is 5 minutes). Spark jobs are slow to start and the machine is small: all of it is one
`detect` run over every capture and every hand-built case together (each case is its own
connection), plus one run over the same rows in another order to show the ids are stable.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.rows import dicts_to_table
from analyzer.timeline import CHANNELS, VIOLATIONS, replay_frames
from analyzer.timeline.tables import CHANNEL_TIMESTAMPS, TS_ONLY
from spark_jobs.detectors import DETECTORS, SEVERITY, detect
from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline import blocks
from spark_jobs.types import spark_schema

from .conftest import CORPUS, ROOT
from .findings_check import LAB_THRESHOLDS as LAB
from .findings_check import problems

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
CLEAN_EXAMPLES = ("clean_async_confirms", "heartbeats")
T0 = 1_795_000_000_000_000_000  # 2026-11-18 UTC, in ns
S = 1_000_000_000

# table -> (schema, timestamp columns derived from _ns ones, the column `date` comes from)
TABLES = {
    "deliveries": (schema.DELIVERIES, schema.DELIVERY_TIMESTAMPS, schema.DELIVERY_DATE_FROM),
    "publishes": (schema.PUBLISHES, schema.PUBLISH_TIMESTAMPS, schema.PUBLISH_DATE_FROM),
    "channels": (CHANNELS, CHANNEL_TIMESTAMPS, "open_ts_ns"),
    "violations": (VIOLATIONS, TS_ONLY, "ts_ns"),
    "frames": (schema.FRAMES, {"ts": "ts_ns"}, "ts_ns"),
    "connections": (schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM),
}


def corpus_captures() -> list[str]:
    with open(os.path.join(CORPUS, "MANIFEST.tsv")) as manifest:
        return [os.path.join(CORPUS, line.split("\t")[0]) for line in manifest.read().splitlines()[1:] if line]


# -- hand-built cases ------------------------------------------------------------------------------

_ports = itertools.count(41000)


class Case:
    """One hand-built connection, `unit-NAME`, and its rows in every table the detectors read.
    Times are seconds after T0; a channel row (channel 1, incarnation 1) unless told otherwise."""

    def __init__(self, name: str, client_addr: str = "10.1.0.1", last_s: float = 600):
        self.name, self.port = f"unit-{name}", next(_ports)
        self.id = f"{client_addr}:{self.port}>10.1.0.254:5672@{T0}"
        self.rows = {table: [] for table in TABLES}
        self.rows["connections"].append(dict(
            connection_id=self.id, agent_id="unit", source=f"unit/{name}.pcapng", client_addr=client_addr,
            client_port=self.port, server_addr="10.1.0.254", server_port=5672, connection_name=self.name,
            first_ts_ns=T0, last_ts_ns=T0 + int(last_s * S), protocol="amqp-0-9-1"))

    def _where(self, fields: dict) -> dict:
        return {"connection_id": self.id, "agent_id": "unit", "channel": 1, "incarnation": 1, **fields}

    def channel(self, **facts) -> Case:
        defaults = dict(open_seq=1, open_ts_ns=T0, history_known=True, gap_seen=False, end_seq=10_000,
                        end_ts_ns=T0 + 600 * S, ended_by="channel.close", closed_by="client", confirm_mode=False,
                        tx_mode=False, consumer_prefetch=0, channel_prefetch=0, consumes=0,
                        unbounded_manual_consumes=0, deliveries=0, publishes=0, peak_unacked=0)
        self.rows["channels"].append(self._where({**defaults, **facts}))
        return self

    def publish(self, seq: int, at: float, **fields) -> Case:
        defaults = dict(channel_open_seq=1, exchange="", routing_key="q", mode="confirm", persistent=True,
                        message_identity=f"id:{self.name}-{seq}", outcome="acked")
        self.rows["publishes"].append(self._where({**defaults, "seq": seq, "ts_ns": T0 + int(at * S), **fields}))
        return self

    def delivery(self, seq: int, at: float, **fields) -> Case:
        defaults = dict(channel_open_seq=1, method="basic.deliver", delivery_tag=seq, consumer_tag="ctag", queue="q",
                        exchange="", routing_key="q", message_identity=f"id:{self.name}-{seq}", redelivered=False,
                        no_ack=False, consumer_prefetch=0, channel_prefetch=0, outcome="ack")
        self.rows["deliveries"].append(self._where({**defaults, "seq": seq, "ts_ns": T0 + int(at * S), **fields}))
        return self

    def violation(self, seq: int, at: float, **fields) -> Case:
        defaults = dict(kind="unknown_tag", evidence="capture", method="basic.ack", delivery_tag=99, multiple=False,
                        broker_close_seq=seq + 1, broker_reply_code=406,
                        broker_reply_text="PRECONDITION_FAILED - unknown delivery tag 99")
        self.rows["violations"].append(self._where({**defaults, "seq": seq, "ts_ns": T0 + int(at * S), **fields}))
        return self

    def frame(self, seq: int, at: float, method: str, direction: str = "to_client", **fields) -> Case:
        self.rows["frames"].append(self._where({
            "channel": 0 if method.startswith("connection.") else 1, "incarnation": None, "seq": seq,
            "ts_ns": T0 + int(at * S), "method": method, "direction": direction,
            "source": f"unit/{self.name}.pcapng", "source_packet": 100 + seq, **fields}))
        return self


def settled(at: float, after: float, outcome: str = "ack", **fields) -> dict:
    """The settlement columns of a delivery or publish made at `at`, settled `after` seconds later."""
    ts, settle = T0 + int(at * S), T0 + int((at + after) * S)
    return dict(settle_ts_ns=settle, settle_latency_ns=settle - ts, outcome=outcome, **fields)


def still_open(at: float, observed: float) -> dict:
    """A delivery made at `at`, still unacked when the data ended `observed` seconds later."""
    return dict(outcome="open", observed_until_ts_ns=T0 + int((at + observed) * S))


def lockstep_publisher(case: Case, publishes: int, idle: float = 0.001, lockstep: int | None = None) -> Case:
    """Confirm-mode publishes each confirmed 1 ms after it went out; the next goes out `idle` after
    that confirm. The first `lockstep` (default all) had nothing pending; the rest had one."""
    lockstep = publishes if lockstep is None else lockstep
    at = 0.0
    for n in range(publishes):
        case.publish(10 + n, at, confirm_seq=n + 1, pending_before=0 if n < lockstep else 1, confirm_tag=n + 1,
                     confirm_multiple=False, out_of_order=False, out_of_order_by=0, **settled(at, 0.001, "acked"))
        at += 0.001 + idle
    return case


def hand_built_cases() -> list[Case]:
    age, stall = LAB.unacked_age_seconds, LAB.prefetch_stall_seconds
    loop = LAB.requeue_loop_deliveries
    cases = []
    add = cases.append

    # lost_confirm: lost confirm-mode publishes count; open, unknown and tx ones never do.
    case = Case("lost").channel(ended_by="tcp.rst", confirm_mode=True)
    for n in range(3):
        case.publish(10 + n, 1 + n, confirm_seq=n + 1, outcome="lost", settle_seq=20, **{
            "settle_ts_ns": T0 + 5 * S}).frame(10 + n, 1 + n, "basic.publish", "to_broker")
    add(case.publish(13, 4, confirm_seq=4, **settled(4, 0.1, "acked")))
    add(Case("not-lost").channel(ended_by="end_of_data")
        .publish(10, 1, outcome="open", observed_until_ts_ns=T0 + 9 * S)
        .publish(11, 1, mode="unknown", outcome="unknown")
        .publish(12, 1, mode="tx", outcome="lost"))

    # confirm_nack and out_of_order_confirm
    add(Case("nacked").channel(confirm_mode=True).publish(10, 1, **settled(1, 0.1, "nacked"))
        .publish(11, 1, **settled(1, 0.1, "nacked")).publish(12, 1, **settled(1, 0.1, "acked")))
    add(Case("ooo").channel(confirm_mode=True)
        .publish(10, 1, out_of_order=False, confirm_multiple=False, **settled(1, 0.5, "acked"))
        .publish(11, 1, out_of_order=True, out_of_order_by=1, confirm_multiple=False, **settled(1, 0.1, "acked"))
        .publish(12, 1, out_of_order=True, out_of_order_by=2, confirm_multiple=False, **settled(1, 0.1, "acked"))
        .publish(13, 1, out_of_order=None, **settled(1, 0.1, "unknown")))

    # unacked_buildup by age: just past the threshold, just under it.
    add(Case("old-unacked").channel(peak_unacked=3, ended_by="end_of_data")
        .delivery(10, 0, **still_open(0, age + 0.1)).delivery(11, 0.15, **still_open(0.15, age - 0.05))
        .delivery(12, 0.1, **settled(0.1, 0.01)))
    add(Case("young-unacked").channel(peak_unacked=1, ended_by="end_of_data")
        .delivery(10, 0, **still_open(0, age - 0.1)))
    # by a stall at the prefetch limit (2), with no delivery as old as the age threshold
    add(Case("stalled").channel(consumer_prefetch=2, peak_unacked=2)
        .delivery(10, 0, consumer_prefetch=2, settle_seq=13, **settled(0, 0.01 + stall + 0.1))
        .delivery(11, 0.01, consumer_prefetch=2, settle_seq=13, **settled(0.01, stall + 0.1)))
    add(Case("not-stalled").channel(consumer_prefetch=2, peak_unacked=2)
        .delivery(10, 0, consumer_prefetch=2, settle_seq=13, **settled(0, 0.01 + stall - 0.1))
        .delivery(11, 0.01, consumer_prefetch=2, settle_seq=13, **settled(0.01, stall - 0.1)))
    # auto-ack and unknown outcomes never age
    add(Case("autoack").channel().delivery(10, 0, no_ack=True, **settled(0, 0, "auto"))
        .delivery(11, 0, outcome="unknown"))
    # mid-stream: the basic.consume is not in the data (no_ack null); an ack of one of the
    # consumer's tags shows it is manual, and then its open delivery ages.
    add(Case("midstream-manual").channel(history_known=False, ended_by="end_of_data", consumer_prefetch=None)
        .delivery(10, 0, no_ack=None, consumer_prefetch=None, **settled(0, 0.01))
        .delivery(11, 0, no_ack=None, consumer_prefetch=None, **still_open(0, age + 1)))
    add(Case("midstream-unknown-mode").channel(history_known=False, ended_by="end_of_data", consumer_prefetch=None)
        .delivery(10, 0, no_ack=None, consumer_prefetch=None, **still_open(0, age + 1)))

    # requeue_loop: `loop` deliveries of one message, each but the last nacked back; one fewer
    # is no loop; a high x-death count is one even when seen once; identical bodies rejected
    # without coming back (not redelivered, no x-death) are different messages.
    case = Case("loop").channel(consumer_prefetch=1)
    for n in range(loop):
        last = n == loop - 1
        case.delivery(10 + n, n, message_id="poison", message_identity="id:poison", redelivered=n > 0,
                      requeue=None if last else True, **settled(n, 0.01, "ack" if last else "nack"))
    add(case)
    case = Case("short-loop").channel(consumer_prefetch=1)
    for n in range(loop - 1):
        last = n == loop - 2
        case.delivery(10 + n, n, message_identity="id:almost", redelivered=n > 0,
                      requeue=None if last else True, **settled(n, 0.01, "ack" if last else "reject"))
    add(case)
    add(Case("dead-letter").channel().delivery(10, 0, message_identity="id:dlx", x_death_count=LAB.dead_letter_loop_count,
                                               **settled(0, 0.01)))
    add(Case("shallow-dead-letter").channel()
        .delivery(10, 0, message_identity="id:dlx-2", x_death_count=LAB.dead_letter_loop_count - 1, **settled(0, 0.01)))
    case = Case("same-body").channel()
    for n in range(loop + 2):
        case.delivery(10 + n, n, message_identity="h:same", requeue=False, **settled(n, 0.01, "reject"))
    add(case)
    # one message bounced twice on one connection, then three times on another: pinned to the second
    wanderer = dict(message_identity="id:wanderer", message_id="wanderer")
    first = Case("wander-a").channel()
    for n in range(2):
        first.delivery(10 + n, n, redelivered=n > 0, requeue=True, **wanderer, **settled(n, 0.01, "nack"))
    second = Case("wander-b").channel()
    for n in range(4):
        last = n == 3
        second.delivery(10 + n, 2 + n, redelivered=True, requeue=None if last else True, **wanderer,
                        **settled(2 + n, 0.01, "ack" if last else "nack"))
    cases += [first, second]

    # unknown_delivery_tag
    add(Case("violations").channel(channel=3, ended_by="channel.close", closed_by="broker", close_code=406)
        .violation(20, 1, channel=3, kind="double_ack", delivery_tag=1)
        .violation(22, 2, channel=3, kind="wrong_channel", delivery_tag=2, delivered_channel=4,
                   delivered_incarnation=1))

    # redelivery_after_close: r1 comes back redelivered after the close (counted); r2's identity
    # comes again but not redelivered (another message); r4 "comes back" before its close (not).
    add(Case("closer").channel()
        .delivery(10, 0, message_identity="id:r1", settle_seq=20, **settled(0, 1, "channel_closed"))
        .delivery(11, 0, message_identity="id:r2", settle_seq=20, **settled(0, 1, "channel_closed"))
        .delivery(12, 0, message_identity="id:r3", **settled(0, 0.1)))
    add(Case("closer-late").channel()
        .delivery(10, 0, message_identity="id:r4", settle_seq=20, **settled(0, 1, "connection_closed")))
    add(Case("taker").channel()
        .delivery(10, 2, message_identity="id:r1", redelivered=True, **settled(2, 0.1))
        .delivery(11, 2, message_identity="id:r2", redelivered=False, **settled(2, 0.1))
        .delivery(12, 0.5, message_identity="id:r4", redelivered=True, **settled(0.5, 0.1)))

    # unroutable_returned, unconfirmed_persistent_publish
    add(Case("returns").channel(confirm_mode=True)
        .frame(20, 1, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="nowhere")
        .frame(22, 2, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="nowhere"))
    add(Case("plain").channel()
        .publish(10, 1, mode="none", outcome="untracked").publish(11, 1, mode="none", outcome="untracked")
        .publish(12, 1, mode="none", persistent=False, outcome="untracked")
        .publish(13, 1, mode="unknown", outcome="unknown"))

    # synchronous_confirms: enough lockstep publishes, then one too few, too low a share, too idle
    n = LAB.synchronous_min_publishes
    add(lockstep_publisher(Case("sync").channel(confirm_mode=True), n))
    add(lockstep_publisher(Case("sync-few").channel(confirm_mode=True), n - 1))
    share_under = int(n * LAB.synchronous_min_share) - 1
    add(lockstep_publisher(Case("sync-share").channel(confirm_mode=True), n, lockstep=share_under))
    add(lockstep_publisher(Case("sync-idle").channel(confirm_mode=True), n, idle=LAB.synchronous_max_idle_seconds * 4))

    # unbounded_prefetch
    add(Case("unbounded").channel(consumes=1, unbounded_manual_consumes=1)
        .frame(5, 0.5, "basic.consume", "to_broker", queue="work", no_ack=False))
    add(Case("bounded").channel(consumes=1, consumer_prefetch=50)
        .frame(5, 0.5, "basic.consume", "to_broker", queue="work", no_ack=False))

    # flow_blocked: blocked and released (IPv6 client), blocked to the end, a channel paused by
    # the broker (the client's own channel.flow does not count)
    add(Case("blocked", client_addr="fd00::7")
        .frame(10, 1, "connection.blocked", detail="low on memory").frame(11, 3, "connection.unblocked"))
    add(Case("still-blocked", last_s=10).frame(10, 1, "connection.blocked", detail="low on disk"))
    add(Case("paused").channel()
        .frame(10, 1, "channel.flow", active=False).frame(11, 1.5, "channel.flow", active=True)
        .frame(12, 2, "channel.flow", "to_broker", active=False))
    return cases


# What each hand-built case must give, all of it: {kind: count}.
UNIT_EXPECTED = {
    "lost": {"lost_confirm": 3}, "not-lost": {},
    "nacked": {"confirm_nack": 2}, "ooo": {"out_of_order_confirm": 2},
    "old-unacked": {"unacked_buildup": 3}, "young-unacked": {},
    "stalled": {"unacked_buildup": 2}, "not-stalled": {}, "autoack": {},
    "midstream-manual": {"unacked_buildup": 1}, "midstream-unknown-mode": {},
    "loop": {"requeue_loop": LAB.requeue_loop_deliveries}, "short-loop": {},
    "dead-letter": {"requeue_loop": 1}, "shallow-dead-letter": {}, "same-body": {},
    "wander-a": {}, "wander-b": {"requeue_loop": 6},
    "violations": {"unknown_delivery_tag": 2},
    "closer": {"redelivery_after_close": 1}, "closer-late": {}, "taker": {},
    "returns": {"unroutable_returned": 2}, "plain": {"unconfirmed_persistent_publish": 2},
    "sync": {"synchronous_confirms": LAB.synchronous_min_publishes}, "sync-few": {}, "sync-share": {}, "sync-idle": {},
    "unbounded": {"unbounded_prefetch": 1}, "bounded": {},
    "blocked": {"flow_blocked": 1}, "still-blocked": {"flow_blocked": 1}, "paused": {"flow_blocked": 1},
}


def unit_tables() -> dict[str, pa.Table]:
    cases = hand_built_cases()
    assert sorted(c.name for c in cases) == sorted(f"unit-{name}" for name in UNIT_EXPECTED)
    return {table: dicts_to_table([row for case in cases for row in case.rows[table]], *spec)
            for table, spec in TABLES.items()}


# -- the captures ----------------------------------------------------------------------------------

def captured_tables(lake_dir: str, captures: list[str]) -> dict[str, pa.Table]:
    """The agent's tables for `captures` and the reference timelines built from them."""
    for capture in captures:
        assert not ingest_file(capture, lake_dir).unreadable, capture
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES)
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS)
    return {**replay_frames(frames), "frames": frames, "connections": connections}


def spark_tables(spark, tables: dict[str, pa.Table], reverse: bool = False) -> dict:
    # One chunk per column: Spark 4.2's createDataFrame(pyarrow.Table) silently drops every
    # chunk after an empty one (and concatenated tables have empty chunks).
    out = {}
    for name, table in tables.items():
        table = table.combine_chunks()
        if reverse:
            table = table.take(pa.array(range(table.num_rows - 1, -1, -1), pa.int64()))
        out[name] = spark.createDataFrame(table, schema=spark_schema(table.schema))
    return out


@pytest.fixture(scope="module")
def everything(tmp_path_factory) -> dict[str, pa.Table]:
    captures = [os.path.abspath(path) for path in EXAMPLES + corpus_captures()]
    captured = captured_tables(str(tmp_path_factory.mktemp("lake")), captures)
    built = unit_tables()
    return {name: pa.concat_tables([captured[name], built[name]]) for name in TABLES}


@pytest.fixture(scope="module")
def output(spark, everything):
    return detect(spark_tables(spark, everything), LAB)


@pytest.fixture(scope="module")
def findings(output) -> list[dict]:
    return [row.asDict() for row in output.collect()]


def connection_ids(tables: dict[str, pa.Table], capture: str) -> set[str]:
    connections = tables["connections"].to_pylist()
    return {c["connection_id"] for c in connections if c["source"] == os.path.abspath(capture)}


def of_capture(findings: list[dict], tables, capture: str) -> list[dict]:
    ids = connection_ids(tables, capture)
    assert ids, f"no connections from {capture}"
    return [f for f in findings if f["connection_id"] in ids]


def on(findings: list[dict], case: str) -> list[dict]:
    return [f for f in findings if f["connection_name"] == f"unit-{case}"]


def evidence_of(finding: dict) -> dict:
    return json.loads(finding["evidence"])


# -- the contract --------------------------------------------------------------------------------

def test_one_detector_per_kind_each_with_a_severity():
    assert tuple(DETECTORS) == schema.FINDING_KINDS
    assert set(SEVERITY) == set(schema.FINDING_KINDS) and set(SEVERITY.values()) <= set(schema.SEVERITIES)


def test_output_schema_is_the_findings_schema_exactly(output):
    assert output.schema == spark_schema(schema.FINDINGS)


def test_every_finding_is_well_formed(findings):
    assert findings
    for f in findings:
        assert f["kind"] in schema.FINDING_KINDS and f["severity"] == SEVERITY[f["kind"]]
        assert f["count"] >= 1 and f["summary"] and f["finding_id"] and len(f["finding_id"]) == 64
        assert f["first_ts_ns"] <= f["last_ts_ns"]
        assert f["first_ts"].timestamp() == pytest.approx(f["first_ts_ns"] / 1e9, abs=1e-6)
        assert f["date"] == datetime.fromtimestamp(f["first_ts_ns"] // 10**9, timezone.utc).strftime("%Y-%m-%d")
        evidence = evidence_of(f)
        assert len(evidence["source_packets"]) == len(evidence.get("seqs", []))
        assert len(evidence.get("seqs", [])) <= 20
        assert (f["channel"] == 0) == (f["incarnation"] is None)
    ids = [f["finding_id"] for f in findings]
    assert len(ids) == len(set(ids))


def test_ids_and_rows_are_the_same_when_run_again_on_reordered_input(spark, everything, findings):
    again = [row.asDict() for row in detect(spark_tables(spark, everything, reverse=True), LAB).collect()]
    key = lambda f: f["finding_id"]  # noqa: E731
    assert sorted(again, key=key) == sorted(findings, key=key)


def test_findings_are_the_same_when_running_values_cross_many_blocks(spark, everything, findings, monkeypatch):
    """Running values over a channel are counted in blocks of seq (spark_jobs/timeline/blocks.py);
    blocks of 3 seqs put a boundary inside nearly every stretch the detectors measure."""
    monkeypatch.setattr(blocks, "BLOCK_SEQS", 3)
    again = [row.asDict() for row in detect(spark_tables(spark, everything), LAB).collect()]
    key = lambda f: f["finding_id"]  # noqa: E731
    assert sorted(again, key=key) == sorted(findings, key=key)


def test_detect_names_what_is_missing(spark):
    with pytest.raises(ValueError, match="missing: connections, frames"):
        detect({name: None for name in ("deliveries", "publishes", "channels", "violations")})
    tables = {name: spark.createDataFrame([], spark_schema(spec[0])) for name, spec in TABLES.items()}
    tables["publishes"] = tables["publishes"].drop("pending_before")
    with pytest.raises(ValueError, match="'publishes' lacks the columns pending_before"):
        detect(tables)


# -- the recorded lab examples and the public corpus ------------------------------------------------

@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_lab_example_expectations_hold(everything, findings, capture):
    with open(capture.replace(".pcapng", ".expected.json")) as f:
        expected = json.load(f)
    assert problems(of_capture(findings, everything, capture), expected) == []


@pytest.mark.parametrize("capture", [os.path.join(ROOT, "examples", f"{name}.pcapng") for name in CLEAN_EXAMPLES]
                         + corpus_captures(), ids=os.path.basename)
def test_nothing_warning_or_worse_on_clean_traffic_and_the_public_corpus(everything, findings, capture):
    loud = [(f["kind"], f["severity"], f["summary"]) for f in of_capture(findings, everything, capture)
            if f["severity"] != "info"]
    assert loud == []


def test_corpus_findings_are_the_known_harmless_ones(everything, findings):
    """What real applications in the corpus do: persistent publishes without confirms (Bunny, the
    Java client) and one mandatory publish returned (pika): information, nothing more."""
    kinds = {(os.path.basename(os.path.dirname(c)) + "/" + os.path.basename(c), f["kind"])
             for c in corpus_captures() for f in of_capture(findings, everything, c)}
    assert kinds == {("amqp-parser/amqp.pcap", "unconfirmed_persistent_publish"),
                     ("deepflow/amqp-error.pcap", "unroutable_returned"),
                     ("tomhjx-netcat/rabbit.pcap", "unconfirmed_persistent_publish"),
                     ("tomhjx-netcat/rabbitmq.pcap", "unconfirmed_persistent_publish")}


def test_evidence_points_at_the_packets_in_the_capture(everything, findings):
    capture = os.path.join(ROOT, "examples", "unknown_delivery_tag.pcapng")
    with open(capture.replace(".pcapng", ".expected.json")) as f:
        expected = json.load(f)
    wanted = {n for entry in expected["expect"] for n in entry["evidence_frames"]}
    shown = {n for f in of_capture(findings, everything, capture) for n in evidence_of(f)["source_packets"]}
    assert wanted <= shown
    assert {f["source"] for f in of_capture(findings, everything, capture)} == {os.path.abspath(capture)}


# -- hand-built cases, both sides of every threshold --------------------------------------------------

@pytest.mark.parametrize("case", list(UNIT_EXPECTED))
def test_hand_built_case_gives_exactly_its_findings(findings, case):
    got = {}
    for f in on(findings, case):
        got[f["kind"]] = got.get(f["kind"], 0) + f["count"]
    assert got == UNIT_EXPECTED[case]


def test_lost_confirm_evidence_and_identity(findings):
    (f,) = on(findings, "lost")
    assert f["severity"] == "critical" and f["channel"] == 1 and f["incarnation"] == 1
    evidence = evidence_of(f)
    assert evidence["confirm_seqs"] == [1, 2, 3] and evidence["seqs"] == [10, 11, 12]
    assert evidence["source_packets"] == [110, 111, 112] and evidence["ended_by"] == "tcp.rst"
    assert f["source"] == "unit/unit-lost.pcapng"
    assert f["client"].startswith("10.1.0.1:") and f["server"] == "10.1.0.254:5672"
    assert (f["first_ts_ns"], f["last_ts_ns"]) == (T0 + S, T0 + 5 * S)


def test_unacked_buildup_measures_age_or_stall(findings):
    (old,) = on(findings, "old-unacked")
    assert old["threshold"] == LAB.unacked_age_seconds and old["value"] == pytest.approx(LAB.unacked_age_seconds + 0.1)
    assert evidence_of(old)["tags"] == [10]  # only the delivery past the threshold
    (stalled,) = on(findings, "stalled")
    assert stalled["threshold"] == LAB.prefetch_stall_seconds
    assert stalled["value"] == pytest.approx(LAB.prefetch_stall_seconds + 0.1)
    assert evidence_of(stalled)["prefetch_limit"] == 2 and "prefetch limit of 2" in stalled["summary"]


def test_requeue_loop_is_one_finding_per_message_pinned_where_it_bounced_most(findings):
    (loop,) = on(findings, "loop")
    assert loop["message_identity"] == "id:poison" and evidence_of(loop)["message_id"] == "poison"
    (dead,) = on(findings, "dead-letter")
    assert dead["value"] == LAB.dead_letter_loop_count == dead["threshold"]
    (wanderer,) = on(findings, "wander-b")
    evidence = evidence_of(wanderer)
    assert evidence["bounces"] == 5 and evidence["deliveries"] == 6 and len(evidence["channels"]) == 2
    assert evidence["seqs"] == [10, 11, 12, 13]  # the pinned connection's own frames


def test_redelivery_after_close_names_where_they_came_back(findings):
    (f,) = on(findings, "closer")
    evidence = evidence_of(f)
    assert evidence["redelivered_on"] == ["unit-taker"] and evidence["message_identities"] == ["id:r1"]


def test_flow_blocked_episodes(findings):
    (blocked,) = on(findings, "blocked")
    assert blocked["channel"] == 0 and blocked["incarnation"] is None and blocked["value"] == pytest.approx(2.0)
    assert blocked["client"].startswith("[fd00::7]:")
    assert evidence_of(blocked)["episodes"] == [{"blocked_seq": 10, "unblocked_seq": 11, "seconds": 2.0}]
    (still,) = on(findings, "still-blocked")
    assert evidence_of(still)["still_blocked"] is True and still["value"] == pytest.approx(9.0)
    (paused,) = on(findings, "paused")
    assert paused["channel"] == 1 and paused["value"] == pytest.approx(0.5)


def test_synchronous_confirms_share_and_violations(findings):
    (sync,) = on(findings, "sync")
    assert sync["value"] == 1.0 and sync["threshold"] == LAB.synchronous_min_share
    assert evidence_of(sync)["median_idle_seconds"] < LAB.synchronous_max_idle_seconds
    (violations,) = on(findings, "violations")
    assert violations["channel"] == 3 and evidence_of(violations)["violations"] == ["double_ack", "wrong_channel"]
    assert evidence_of(violations)["delivered_on_channels"] == [None, 4]


# -- thresholds and the expectations check (no Spark) -------------------------------------------------

def test_production_defaults_are_production_scale():
    defaults = Thresholds()
    assert defaults.unacked_age_seconds >= 60 and defaults.prefetch_stall_seconds >= 30
    assert defaults.requeue_loop_deliveries >= 5 and defaults.synchronous_min_publishes >= 50


def test_thresholds_from_cli_pairs():
    t = Thresholds.from_pairs(["unacked_age_seconds=120", "requeue_loop_deliveries = 7"])
    assert (t.unacked_age_seconds, t.requeue_loop_deliveries) == (120.0, 7)
    assert t.prefetch_stall_seconds == Thresholds().prefetch_stall_seconds
    with pytest.raises(ValueError, match="unknown threshold 'unacked_age'.*unacked_age_seconds"):
        Thresholds.from_pairs(["unacked_age=1"])
    with pytest.raises(ValueError, match="expected name=value"):
        Thresholds.from_pairs(["unacked_age_seconds"])
    with pytest.raises(ValueError, match="requeue_loop_deliveries needs an integer"):
        Thresholds.from_pairs(["requeue_loop_deliveries=2.5"])
    with pytest.raises(ValueError, match="synchronous_min_share must be in"):
        Thresholds.from_pairs(["synchronous_min_share=1.5"])
    with pytest.raises(ValueError, match="must be > 0"):
        Thresholds.from_pairs(["unacked_age_seconds=0"])


def test_the_expectations_check_catches_misses_and_forbidden_kinds():
    finding = {"kind": "lost_confirm", "connection_name": "pub", "connection_id": "c", "channel": 1, "count": 4,
               "severity": "critical", "message_identity": None, "evidence": "{}"}
    expected = {"expect": [{"kind": "lost_confirm", "connection_name": "pub", "channel": 1, "min_count": 5}],
                "forbid": ["lost_confirm"], "forbid_on": [{"kind": "lost_confirm", "connection_name": "pub"}]}
    found = problems([finding], expected)
    assert len(found) == 3 and "count >= 5, found 4" in found[0]
    assert problems([dict(finding, count=5)], {"expect": expected["expect"]}) == []
    assert problems([dict(finding, channel=2, count=9)], {"expect": expected["expect"]}) != []
