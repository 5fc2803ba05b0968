"""The detectors of the kinds about one connection (analyzer.detectors), directly, without Spark:

- every recorded example fed as the pass feeds it, against the findings the session's analysed
  lake (conftest `analysed_examples`) stores;
- the hand-built cases of tests/detector_cases.py: their evidence, records in any order, packets
  looked up after the pass, rows of the findings schema (test_detectors.py checks every case's
  counts of every kind, the cross-connection ones from the findings step);
- how numbers are formatted and the median picked.

Also the feeding helpers test_detectors.py uses, and the random connections (tests/test_timeline.py's
generator, with flow control and uneven clocks added) tests/test_connection_pass.py runs the pass on.
Evidence JSON is compared parsed.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.detectors import KINDS, ConnectionDetectors, detect_connection, evidence_seqs, finish, wants_frame
from analyzer.detectors.common import fixed
from analyzer.detectors.publisher import lower_median_index
from analyzer.rows import dicts_to_table
from analyzer.timeline import INPUT_COLUMNS, Timelines
from analyzer.timeline import records as r

from .detector_cases import S, T0, hand_built_cases
from .findings_check import LAB_THRESHOLDS as LAB
from .test_timeline import renumbered, valid_traffic


def comparable(findings: list[dict]) -> dict[str, dict]:
    """finding_id -> the finding, its evidence parsed."""
    out = {}
    for f in findings:
        assert f["finding_id"] not in out, f
        out[f["finding_id"]] = dict(f, evidence=json.loads(f["evidence"]))
    return out


def assert_same(got: list[dict], expected: list[dict]) -> None:
    got, expected = comparable(got), comparable(expected)
    assert sorted(got) == sorted(expected), ([(g["kind"], g["summary"]) for g in got.values()],
                                              [(e["kind"], e["summary"]) for e in expected.values()])
    for finding_id, wanted in expected.items():
        differing = {k: (got[finding_id][k], v) for k, v in wanted.items() if got[finding_id][k] != v}
        assert not differing, (wanted["kind"], differing)


def packets_from(frames: list[dict]):
    located = {row["seq"]: (row["source_packet"], row["source"]) for row in frames}
    return lambda seqs: [located.get(seq) for seq in seqs]


def findings_by_connection(frames: list[dict], connections: list[dict], thresholds) -> dict[str, list[dict]]:
    """Each connection's frames through the timelines and the detectors, as the pass does it:
    one row at a time, the records each row completes handed on as they come."""
    by_connection = defaultdict(list)
    for row in sorted(frames, key=lambda row: (row["connection_id"], row["seq"])):
        by_connection[row["connection_id"]].append(row)
    out = {}
    for connection in connections:
        rows = by_connection[connection["connection_id"]]
        detectors = ConnectionDetectors(connection, thresholds)
        timelines = Timelines()
        for row in rows:
            if wants_frame(row):
                detectors.frame(row)
            for record in timelines.feed({name: row.get(name) for name in INPUT_COLUMNS}):
                detectors.record(record)
        for record in timelines.end_of_data():
            detectors.record(record)
        out[connection["connection_id"]] = detectors.findings(packets_from(rows))
    return out


# -- every recorded example, against the analysed lake ------------------------------------------------

def test_every_example_gives_the_findings_the_analysis_stored(analysed_examples):
    lake_dir, _ = analysed_examples
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES).to_pylist()
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS).to_pylist()
    stored = [f for f in lake.read_table(lake_dir, "findings", schema.FINDINGS).to_pylist() if f["kind"] in KINDS]
    mine = findings_by_connection(frames, connections, LAB)
    assert len(stored) >= 8 and len({f["kind"] for f in stored}) >= 6  # the examples do show these kinds
    for connection in connections:
        connection_id = connection["connection_id"]
        assert_same(mine[connection_id], [f for f in stored if f["connection_id"] == connection_id])


# -- the hand-built cases of tests/detector_cases.py -----------------------------------------------------

def as_record(record_type, row: dict):
    return record_type(**{name: row.get(name) for name in record_type.__slots__})


def case_inputs(case) -> tuple[list, list[dict], dict]:
    """A hand-built case as the pass would hand it over: records, frame rows, connection row."""
    records = [as_record(record_type, row) for table, record_type in
               (("deliveries", r.Delivery), ("publishes", r.Publish), ("channels", r.ChannelFacts),
                ("violations", r.Violation)) for row in case.rows[table]]
    frames = sorted(case.rows["frames"], key=lambda row: row["seq"])
    return records, frames, case.rows["connections"][0]


def fed_case(case) -> tuple[ConnectionDetectors, list[dict], dict]:
    """A hand-built case's detectors fed its frames and records; its frames and connection row."""
    records, frames, connection = case_inputs(case)
    detectors = ConnectionDetectors(connection, LAB)
    for row in frames:
        detectors.frame(row)
    for record in records:
        detectors.record(record)
    return detectors, frames, connection


def case_findings(case, thresholds=LAB, reverse: bool = False) -> list[dict]:
    """A hand-built case's findings (`reverse`: its records handed over in reverse)."""
    records, frames, connection = case_inputs(case)
    return detect_connection(records[::-1] if reverse else records, frames, connection, thresholds,
                             packets_from(frames))


@pytest.fixture(scope="module")
def unit_findings() -> dict[str, list[dict]]:
    return {case.name.removeprefix("unit-"): case_findings(case) for case in hand_built_cases()}


def test_findings_are_rows_of_the_findings_schema(unit_findings):
    rows = [f for found in unit_findings.values() for f in found]
    assert {f["kind"] for f in rows} == set(KINDS)
    table = dicts_to_table(rows, schema.FINDINGS, schema.FINDING_TIMESTAMPS, schema.FINDING_DATE_FROM)
    assert table.to_pylist() == rows  # the derived columns (date, first_ts, last_ts) agree too


def test_records_in_any_order_give_the_same_findings():
    for case in hand_built_cases():
        assert case_findings(case, reverse=True) == case_findings(case), case.name


def test_packets_looked_up_after_the_pass_give_the_same_rows():
    """The pass sees each frame once; the evidence seqs are known at the connection's end. Looking
    up only `evidence_seqs` afterwards gives the rows `findings` gives with every frame at hand."""
    for case in hand_built_cases():
        detectors, frames, connection = fed_case(case)
        raw = detectors.raw_findings()
        wanted = set(evidence_seqs(raw))
        kept = packets_from([row for row in frames if row["seq"] in wanted])
        assert [finish(f, connection, kept) for f in raw] == case_findings(case), case.name


def evidence_of(finding: dict) -> dict:
    return json.loads(finding["evidence"])


def test_lost_confirm_evidence_and_identity(unit_findings):
    (f,) = unit_findings["lost"]
    assert f["severity"] == "critical" and f["channel"] == 1 and f["incarnation"] == 1
    evidence = evidence_of(f)
    assert evidence["confirm_seqs"] == [1, 2, 3] and evidence["seqs"] == [10, 11, 12]
    assert evidence["source_packets"] == [110, 111, 112] and evidence["ended_by"] == "tcp.rst"
    assert f["source"] == "unit/unit-lost.pcapng"
    assert f["client"].startswith("10.1.0.1:") and f["server"] == "10.1.0.254:5672"
    assert (f["first_ts_ns"], f["last_ts_ns"]) == (T0 + S, T0 + 5 * S)


def test_unacked_buildup_measures_age_or_stall(unit_findings):
    (old,) = unit_findings["old-unacked"]
    assert old["threshold"] == LAB.unacked_age_seconds and old["value"] == pytest.approx(LAB.unacked_age_seconds + 0.1)
    assert evidence_of(old)["tags"] == [10]  # only the delivery past the threshold
    (stalled,) = unit_findings["stalled"]
    assert stalled["threshold"] == LAB.prefetch_stall_seconds
    assert stalled["value"] == pytest.approx(LAB.prefetch_stall_seconds + 0.1)
    assert evidence_of(stalled)["prefetch_limit"] == 2 and "prefetch limit of 2" in stalled["summary"]


def test_flow_blocked_episodes(unit_findings):
    (blocked,) = unit_findings["blocked"]
    assert blocked["channel"] == 0 and blocked["incarnation"] is None and blocked["value"] == pytest.approx(2.0)
    assert blocked["client"].startswith("[fd00::7]:")
    assert evidence_of(blocked)["episodes"] == [{"blocked_seq": 10, "unblocked_seq": 11, "seconds": 2.0}]
    (still,) = unit_findings["still-blocked"]
    assert evidence_of(still)["still_blocked"] is True and still["value"] == pytest.approx(9.0)
    assert "unblocked_seq" not in evidence_of(still)["episodes"][0]  # null fields are left out, as in Spark
    (paused,) = unit_findings["paused"]
    assert paused["channel"] == 1 and paused["value"] == pytest.approx(0.5)


def test_synchronous_confirms_share_and_violations(unit_findings):
    (sync,) = unit_findings["sync"]
    assert sync["value"] == 1.0 and sync["threshold"] == LAB.synchronous_min_share
    assert evidence_of(sync)["median_idle_seconds"] < LAB.synchronous_max_idle_seconds
    (violations,) = unit_findings["violations"]
    assert violations["channel"] == 3 and evidence_of(violations)["violations"] == ["double_ack", "wrong_channel"]
    assert evidence_of(violations)["delivered_on_channels"] == [None, 4]


def test_numbers_in_summaries_round_as_spark_writes_them():
    # Java's Formatter rounds half up on the shortest decimal form; Python's %.1f rounds the binary value.
    assert [fixed(x, 1) for x in (0.25, 0.15, 2.0, 1.05, 9.95)] == ["0.3", "0.2", "2.0", "1.1", "10.0"]
    assert fixed(12.5, 0) == "13" and fixed(None, 1) == "null"


def test_the_median_idle_time_is_the_value_spark_gives():
    # percentile_approx(x, 0.5) over 1..n, as measured on Spark 4 (exact below 10,000 values)
    spark_answers = {1: 1, 2: 1, 3: 2, 4: 2, 5: 3, 6: 3, 7: 4, 10: 5, 19: 10, 20: 10, 21: 11, 100: 50, 5001: 2501}
    assert {n: lower_median_index(n) + 1 for n in spark_answers} == spark_answers


# -- random connections, for tests/test_connection_pass.py ----------------------------------------------

FLOW = ("connection.blocked", "connection.unblocked", "channel.flow")


def with_flow_control(data, rows: list[dict]) -> list[dict]:
    rows = list(rows)
    for _ in range(data.draw(st.integers(0, 4), label="flow frames")):
        method = data.draw(st.sampled_from(FLOW))
        row = {"connection_id": rows[0]["connection_id"], "method": method,
               "direction": data.draw(st.sampled_from(["to_client", "to_client", "to_broker"])),
               "channel": 0 if method != "channel.flow" else data.draw(st.integers(1, 3))}
        if method == "channel.flow":
            row["active"] = data.draw(st.sampled_from([True, False, None]))
        if method == "connection.blocked":
            row["detail"] = data.draw(st.sampled_from([None, "low on memory"]))
        rows.insert(data.draw(st.integers(0, len(rows))), row)
    return rows


def uneven_clock(data, rows: list[dict]) -> list[dict]:
    """Steps of 0 (ties), 30 or 400 ms between rows: the lab thresholds (an unacked delivery stuck at
    1.2 s, a prefetch stall of 0.6 s, lockstep publishes 50 ms apart) fall inside a connection."""
    at, out = T0, []
    for row in rows:
        at += data.draw(st.sampled_from([0, 30_000_000, 30_000_000, 400_000_000]))
        out.append(dict(row, ts_ns=at))
    return out


def random_connections(data, n: int) -> tuple[list[dict], list[dict]]:
    """`n` connections of random traffic, each as is or in one of tests/variants.py's variants
    (reordered, mid-stream, a capture gap, bad acks), with flow-control frames and uneven clocks."""
    from .variants import VARIANTS

    frames, connections = [], []
    for i in range(n):
        connection_id = f"10.0.0.1:{40000 + i}>10.0.0.2:5672@{i}"
        variant = VARIANTS[data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")]
        traffic = valid_traffic(data, transactions=data.draw(st.booleans()))
        rows = [dict(row, connection_id=connection_id) for row in traffic.conv.rows]
        if variant is not None:
            rows = [dict(row, connection_id=connection_id) for row in variant(data, rows)]
        rows = uneven_clock(data, renumbered(with_flow_control(data, rows)))
        source = f"random/{i}.pcapng"
        frames += [dict(row, agent_id="test", source=source, source_packet=1000 + row["seq"]) for row in rows]
        connections.append(dict(connection_id=connection_id, agent_id="test", source=source, client_addr="10.0.0.1",
                                client_port=40000 + i, server_addr="10.0.0.2", server_port=5672,
                                connection_name=f"random-{i}", first_ts_ns=rows[0]["ts_ns"],
                                last_ts_ns=rows[-1]["ts_ns"], protocol="amqp-0-9-1"))
    return frames, connections
