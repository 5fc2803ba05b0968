"""The findings of every kind, as the analysis computes them: the ten kinds about one connection by
the Python detectors (analyzer.detectors, fed as the pass feeds them: tests/test_detectors_python.py),
the two that follow a message across connections by the pipeline's findings step over a lake
(spark_jobs/findings.py `refresh_findings`, as a full run calls it: the one route both executors
take; the rules themselves without the lake: tests/test_message_kinds.py). On the recorded lab
examples and the public corpus, ingested by the real agent and run through the reference
timelines, and on the hand-built cases of tests/detector_cases.py.

Lab captures last seconds, so everything here runs with the lab-scale thresholds of
tests/findings_check.py (a delivery unacked 1.2 s is "stuck" in the lab; in production the
default is 5 minutes). All of it is one lake of every capture and every hand-built case together
(each case is its own connection), plus one of the same rows in another order to show the ids
are stable.
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analyzer import lake, schema
from analyzer.detectors import KINDS
from analyzer.detectors.messages import candidates, in_loop, left_at_close
from analyzer.detectors.thresholds import Thresholds
from analyzer.ingest import ingest_file
from analyzer.rows import dicts_to_table
from analyzer.timeline import replay_frames
from analyzer.timeline.records import DELIVERY_OUTCOMES
from spark_jobs.connection_pass import RAW_FINDINGS
from spark_jobs.findings import refresh_findings
from spark_jobs.provisional import PROVISIONAL
from spark_jobs.requeue_related import REQUEUE_RELATED
from spark_jobs.timeline.tables import TIMELINE_TABLES, as_stored

from .conftest import CORPUS, ROOT
from .detector_cases import TABLES, UNIT_EXPECTED, Case, hand_built_cases
from .findings_check import LAB_THRESHOLDS as LAB
from .findings_check import problems
from .test_detectors_python import assert_same, case_findings, findings_by_connection
from .test_message_kinds import KINDS as MESSAGE_KINDS
from .test_message_kinds import message_findings

SEVERITY = schema.FINDING_SEVERITY
# The tables the findings step reads, as the pipeline stores them.
STORED = {"frames": schema.FRAMES, "connections": schema.CONNECTIONS, "deliveries": TIMELINE_TABLES["deliveries"]}

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
CLEAN_EXAMPLES = ("clean_async_confirms", "heartbeats")


def corpus_captures() -> list[str]:
    with open(os.path.join(CORPUS, "MANIFEST.tsv")) as manifest:
        return [os.path.join(CORPUS, line.split("\t")[0]) for line in manifest.read().splitlines()[1:] if line]


def unit_tables(cases: list[Case]) -> dict[str, pa.Table]:
    assert sorted(c.name for c in cases) == sorted(f"unit-{name}" for name in UNIT_EXPECTED)
    return {table: dicts_to_table([row for case in cases for row in case.rows[table]], *spec)
            for table, spec in TABLES.items()}


# -- the captures and the cases, through the detectors ----------------------------------------------

def captured_tables(lake_dir: str, captures: list[str]) -> dict[str, pa.Table]:
    """The agent's tables for `captures` and the reference timelines built from them."""
    for capture in captures:
        assert not ingest_file(capture, lake_dir).unreadable, capture
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES)
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS)
    return {**replay_frames(frames), "frames": frames, "connections": connections}


def findings_step(lake_dir: str, tables: dict[str, pa.Table], reverse: bool = False) -> list[dict]:
    """The message kinds' findings of `tables` as a full run makes them: frames, connections and
    deliveries written to a lake as the pipeline stores them (the deliveries flagged, the
    candidates in files of their own), then the pipeline's findings step over it
    (findings.refresh_findings: every candidate changed, no finding about one connection handed
    in), its findings table read back. `reverse`: every table's rows in reverse order."""
    for name, table_schema in STORED.items():
        rows = tables[name]
        if reverse:
            rows = rows.take(pa.array(range(rows.num_rows - 1, -1, -1), pa.int64()))
        if name == "deliveries":
            rows = as_stored(name, rows, provisional=False)
        writer = lake.TableWriter(lake_dir, name, table_schema, split_by=tuple(
            flag for flag in (PROVISIONAL, REQUEUE_RELATED) if flag in table_schema.names))
        writer.write(rows.cast(table_schema))
        writer.commit(f"test-{name}")
    refresh_findings(lake_dir, RAW_FINDINGS.empty_table(), None, None, LAB, (), None)
    return lake.read_table(lake_dir, "findings", schema.FINDINGS).to_pylist()


def own_findings(captured: dict[str, pa.Table], cases: list[Case], reverse: bool = False) -> list[dict]:
    """The findings about one connection: each captured connection's frames through the state
    machine and the detectors, each case's rows as records (`reverse`: every input row list reversed)."""
    def order(rows: list) -> list:
        return rows[::-1] if reverse else rows

    by_connection = findings_by_connection(order(captured["frames"].to_pylist()),
                                           order(captured["connections"].to_pylist()), LAB)
    return ([f for found in by_connection.values() for f in found]
            + [f for case in cases for f in case_findings(case, reverse=reverse)])


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict[str, pa.Table]:
    captures = [os.path.abspath(path) for path in EXAMPLES + corpus_captures()]
    return captured_tables(str(tmp_path_factory.mktemp("lake")), captures)


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return hand_built_cases()


@pytest.fixture(scope="module")
def everything(captured, cases) -> dict[str, pa.Table]:
    built = unit_tables(cases)
    return {name: pa.concat_tables([captured[name], built[name]]) for name in TABLES}


@pytest.fixture(scope="module")
def analysed(tmp_path_factory, everything) -> str:
    """The lake the findings step ran over (`findings_step`)."""
    lake_dir = str(tmp_path_factory.mktemp("analysed"))
    findings_step(lake_dir, everything)
    return lake_dir


@pytest.fixture(scope="module")
def output(analysed) -> list[dict]:
    """The cross-connection kinds, from the pipeline's findings step."""
    return lake.read_table(analysed, "findings", schema.FINDINGS).to_pylist()


@pytest.fixture(scope="module")
def findings(captured, cases, output) -> list[dict]:
    return own_findings(captured, cases) + output


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

def test_every_kind_is_decided_once_each_with_a_severity(output):
    assert not set(KINDS) & set(MESSAGE_KINDS)
    assert sorted(KINDS + MESSAGE_KINDS) == sorted(schema.FINDING_KINDS)
    assert set(SEVERITY) == set(schema.FINDING_KINDS) and set(SEVERITY.values()) <= set(schema.SEVERITIES)
    assert {f["kind"] for f in output} == set(MESSAGE_KINDS)   # the step decides those, and only those


def test_output_schema_is_the_findings_schema_exactly(analysed):
    """Every file the findings step wrote holds the findings schema's columns, types and order
    (`date` is the partition, in the log), and the table's schema names them all."""
    table = lake.open_table(analysed, "findings")
    in_files = pa.schema([f for f in schema.FINDINGS if f.name not in schema.PARTITION_BY])
    files = sorted(lake.table_files(table))
    assert files
    for path in files:
        assert pq.read_schema(os.path.join(analysed, "findings", path)).remove_metadata() == in_files, path
    assert table.schema().to_arrow().names == schema.FINDINGS.names
    assert table.metadata().partition_columns == list(schema.PARTITION_BY)


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


def test_ids_and_rows_are_the_same_when_run_again_on_reordered_input(tmp_path, captured, cases, everything, findings):
    again = own_findings(captured, cases, reverse=True) + findings_step(str(tmp_path), everything, reverse=True)
    key = lambda f: f["finding_id"]  # noqa: E731
    assert sorted(again, key=key) == sorted(findings, key=key)


def test_the_candidate_deliveries_alone_give_the_message_kinds_findings_exactly(tmp_path, everything, output):
    """The message kinds read only the candidate deliveries (every delivery of a message that can
    loop, every closed or redelivered one): a lake holding those alone gives the same findings,
    row for row, as one holding every delivery, on cases with loops, dead-letter cycles, closes
    and identical bodies that are not the same message."""
    deliveries = everything["deliveries"]
    narrowed = deliveries.filter(candidates(deliveries))
    assert 0 < narrowed.num_rows < deliveries.num_rows
    again = findings_step(str(tmp_path), {**everything, "deliveries": narrowed})
    assert {f["kind"] for f in output} == set(MESSAGE_KINDS)
    key = lambda f: f["finding_id"]  # noqa: E731
    assert sorted(again, key=key) == sorted(output, key=key)


def test_the_findings_step_gives_what_the_python_rules_give(everything, output):
    """The pipeline's findings step (the candidates read from their files, gathered by message,
    then by incarnation; the packets' scan of `frames`) against the same rules run over the same
    rows in plain Python."""
    located = defaultdict(dict)
    for frame in everything["frames"].select(["connection_id", "seq", "source_packet", "source"]).to_pylist():
        located[frame["connection_id"]][frame["seq"]] = (frame["source_packet"], frame["source"])
    expected = message_findings(everything["deliveries"].to_pylist(), everything["connections"].to_pylist(),
                                lambda cid: lambda seqs: [located[cid].get(seq) for seq in seqs], LAB)
    assert {f["kind"] for f in expected} == set(MESSAGE_KINDS)
    assert_same(output, expected)


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
# (the evidence of the kinds about one connection: test_detectors_python.py)

@pytest.mark.parametrize("case", list(UNIT_EXPECTED))
def test_hand_built_case_gives_exactly_its_findings(findings, case):
    got = {}
    for f in on(findings, case):
        got[f["kind"]] = got.get(f["kind"], 0) + f["count"]
    assert got == UNIT_EXPECTED[case]


def test_requeue_loop_is_one_finding_per_message_pinned_where_it_bounced_most(findings):
    (loop,) = on(findings, "loop")
    assert loop["message_identity"] == "id:poison" and evidence_of(loop)["message_id"] == "poison"
    (echo,) = on(findings, "echo")  # the plain deliveries of its body between bounce and return are not counted
    assert evidence_of(echo)["deliveries"] == LAB.requeue_loop_deliveries == echo["count"]
    assert evidence_of(echo)["channels"] == [f"{echo['connection_id']}#1"]
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


def test_the_stored_requeue_related_flag_is_what_the_python_rules_read():
    """analyzer.detectors.messages.candidates, the Arrow form of the rules' `in_loop` and
    `left_at_close`: the writers flag with it the deliveries the message kinds read
    (requeue_related.py) and both executors pick them with it (cross_connection_findings.py). It
    must pick every row the rules read (else a file holding one would be skipped) and no other.
    Every combination of what they read."""
    from spark_jobs.requeue_related import REQUEUE_RELATED, with_flags

    rows = [dict(provisional=False, message_identity=identity, outcome=outcome, x_death_count=x_death,
                 redelivered=redelivered, settle_ts_ns=settled)
            for identity in (None, "m1")
            for outcome in (*DELIVERY_OUTCOMES, None)
            for x_death in (None, 0, 2)
            for redelivered in (None, False, True)
            for settled in (None, 7)]
    table = pa.Table.from_pylist(rows, schema=pa.schema([
        ("provisional", pa.bool_()), ("message_identity", pa.string()), ("outcome", pa.string()),
        ("x_death_count", pa.int64()), ("redelivered", pa.bool_()), ("settle_ts_ns", pa.int64())]))
    flagged = with_flags(table)
    assert flagged.column_names[:2] == ["provisional", REQUEUE_RELATED]
    assert None not in flagged[REQUEUE_RELATED].to_pylist()
    assert flagged[REQUEUE_RELATED].to_pylist() == candidates(table.to_batches()[0]).to_pylist()
    picked = flagged.to_pylist()
    assert {row[REQUEUE_RELATED] for row in picked} == {True, False}
    for row in picked:
        read = in_loop(row) or (row["message_identity"] is not None and left_at_close(row))
        assert row[REQUEUE_RELATED] is read, row
