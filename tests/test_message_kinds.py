"""The kinds that follow a message across connections (analyzer/detectors/messages.py), directly,
without a lake: each message's deliveries gathered here as the findings step gathers them (by
message identity; then each incarnation's matches), on the hand-built cases of
tests/detector_cases.py and on traffic made up to probe each rule. tests/test_detectors.py runs the
same cases through the pipeline's findings step and compares the two (`message_findings` below is
its reference).
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from operator import itemgetter

import pytest

from analyzer.detectors import finish
from analyzer.detectors.common import EVIDENCE, MAX_EVIDENCE
from analyzer.detectors.messages import (COLUMNS, JOURNEY_ORDER, Journey, after_close_finding,
                                         redelivered_after_close)

from .detector_cases import UNIT_EXPECTED, hand_built_cases
from .findings_check import LAB_THRESHOLDS as LAB

KINDS = ("requeue_loop", "redelivery_after_close")


def raw_message_findings(deliveries: Iterable[Mapping], names: Mapping[str, str | None], thresholds) -> list:
    """(connection_id, RawFinding) of both kinds in `deliveries` (schema.DELIVERIES rows, any order;
    a column missing is null), gathered as spark_jobs/cross_connection_findings.py gathers them. `names`:
    connection_id -> its name."""
    by_message = defaultdict(list)
    for d in deliveries:
        if d.get("message_identity") is not None:
            by_message[d["message_identity"]].append({**{column: d.get(column) for column in COLUMNS},
                                                      "connection_name": names.get(d["connection_id"])})
    found, by_incarnation = [], defaultdict(list)
    for rows in by_message.values():
        journey = Journey()
        for row in sorted(rows, key=itemgetter(*JOURNEY_ORDER)):
            journey.add(row)
        found.append(journey.finding(thresholds))
        for match in redelivered_after_close(rows):
            by_incarnation[(match.connection_id, match.channel, match.incarnation)].append(match)
    found += [after_close_finding(matches) for matches in by_incarnation.values()]
    return [f for f in found if f is not None]


def message_findings(deliveries: list[dict], connections: list[dict], packets_for, thresholds) -> list[dict]:
    """schema.FINDINGS rows (dicts) of both kinds: `raw_message_findings` finished with the first
    row of each connection (as connection_pass.headers picks it). `packets_for(connection_id)`:
    that connection's `packets_of` (analyzer.detectors.finish)."""
    first = {}
    for c in sorted(connections, key=itemgetter("first_ts_ns", "agent_id")):
        first.setdefault(c["connection_id"], c)
    names = {cid: c.get("connection_name") for cid, c in first.items()}
    return [finish(raw, first.get(cid, {"connection_id": cid}), packets_for(cid))
            for cid, raw in raw_message_findings(deliveries, names, thresholds)]


def no_packets(connection_id: str):
    return lambda seqs: [None for _ in seqs]


@pytest.fixture(scope="module")
def cases():
    return hand_built_cases()


def by_case(cases, findings: list[dict]) -> dict[str, dict[str, int]]:
    names = {case.id: case.name.removeprefix("unit-") for case in cases}
    got = defaultdict(dict)
    for f in findings:
        got[names[f["connection_id"]]][f["kind"]] = got[names[f["connection_id"]]].get(f["kind"], 0) + f["count"]
    return got


def expected_of_kinds(case: str) -> dict[str, int]:
    return {kind: n for kind, n in UNIT_EXPECTED[case].items() if kind in KINDS}


def test_hand_built_cases_give_exactly_their_findings_of_these_kinds(cases):
    deliveries = [d for case in cases for d in case.rows["deliveries"]]
    connections = [c for case in cases for c in case.rows["connections"]]
    got = by_case(cases, message_findings(deliveries, connections, no_packets, LAB))
    assert ({case: got.get(case, {}) for case in UNIT_EXPECTED}
            == {case: expected_of_kinds(case) for case in UNIT_EXPECTED})


def test_the_order_deliveries_arrive_in_does_not_matter(cases):
    deliveries = [d for case in cases for d in case.rows["deliveries"]]
    connections = [c for case in cases for c in case.rows["connections"]]
    shuffled = deliveries[:]
    random.Random(7).shuffle(shuffled)
    def as_text(findings):
        return sorted(json.dumps(f, default=str, sort_keys=True) for f in findings)

    assert as_text(message_findings(shuffled, connections, no_packets, LAB)) == as_text(
        message_findings(deliveries, connections, no_packets, LAB))


def test_evidence_is_spelled_in_the_one_vocabulary(cases):
    deliveries = [d for case in cases for d in case.rows["deliveries"]]
    raws = raw_message_findings(deliveries, {}, LAB)
    assert {raw.kind for _, raw in raws} == set(KINDS)
    for _, raw in raws:
        assert set(raw.evidence) <= set(EVIDENCE), raw.evidence


# -- each rule, on made-up deliveries ----------------------------------------------------------------

def delivery(connection: str, seq: int, ts: int, **fields) -> dict:
    row = dict(connection_id=connection, agent_id="a", channel=1, incarnation=1, seq=seq, ts_ns=ts,
               delivery_tag=seq, message_id=None, message_identity="m", redelivered=False, x_death_count=None,
               outcome="ack", requeue=None, settle_seq=None, settle_ts_ns=ts + 1)
    return {**row, **fields}


def loop_finding(rows: list[dict], thresholds=LAB):
    journey = Journey()
    for row in sorted(rows, key=itemgetter(*JOURNEY_ORDER)):
        journey.add(row)
    return journey.finding(thresholds)


def bounced(connection: str, seq: int, ts: int, **fields) -> dict:
    return delivery(connection, seq, ts, outcome="nack", requeue=True, **fields)


def test_a_bounce_counts_only_when_the_message_comes_back():
    loop = LAB.requeue_loop_deliveries
    rows = [bounced("c1", n, n * 10, redelivered=n > 0) for n in range(loop - 1)]
    rows.append(delivery("c1", loop - 1, (loop - 1) * 10, redelivered=True))
    connection_id, raw = loop_finding(rows)
    assert (connection_id, raw.count, raw.evidence["bounces"], raw.message_identity) == ("c1", loop, loop - 1, "m")
    # Nacked without requeue and never seen again: each delivery a message of its own body, no loop.
    assert loop_finding([delivery("c1", n, n, outcome="reject", requeue=False) for n in range(loop + 3)]) is None
    # The last bounce is not followed by a return: one bounce fewer, under the threshold.
    assert loop_finding(rows[:-1]) is None


def test_plain_deliveries_of_an_identical_body_are_not_in_the_loop():
    loop = LAB.requeue_loop_deliveries
    rows = []
    for n in range(loop):
        rows.append(bounced("c1", 10 + n, n * 10, redelivered=n > 0) if n < loop - 1
                    else delivery("c1", 10 + n, n * 10, redelivered=True))
        rows.append(delivery("c2", 10 + n, n * 10 + 5))   # another message with the same body
    _, raw = loop_finding(rows)
    assert raw.count == loop and raw.evidence["deliveries"] == loop and raw.evidence["channels"] == ["c1#1"]


def test_a_loop_is_pinned_where_it_bounced_most_and_names_that_places_frames():
    rows = [bounced("c1", 1, 0), bounced("c1", 2, 10, redelivered=True)]
    rows += [bounced("c2", 100 + n, 20 + n, redelivered=True) for n in range(3)]
    rows.append(delivery("c3", 7, 99, redelivered=True))
    connection_id, raw = loop_finding(rows)
    assert connection_id == "c2" and raw.count == 6 and raw.evidence["seqs"] == [100, 101, 102]
    assert raw.evidence["channels"] == ["c1#1", "c2#1", "c3#1"] and raw.first_ts_ns == 0 and raw.last_ts_ns == 100


def test_a_dead_letter_cycle_fires_on_its_x_death_count_alone():
    connection_id, raw = loop_finding([delivery("c1", 1, 0, x_death_count=LAB.dead_letter_loop_count)])
    assert raw.value == raw.threshold == LAB.dead_letter_loop_count and raw.count == 1
    assert "dead-lettered" in raw.summary
    assert loop_finding([delivery("c1", 1, 0, x_death_count=LAB.dead_letter_loop_count - 1)]) is None


def test_evidence_lists_the_first_items_of_a_message_delivered_many_times():
    rows = [bounced("c1", n, n, redelivered=n > 0) for n in range(10 * MAX_EVIDENCE)][::-1]
    _, raw = loop_finding(rows)
    assert raw.evidence["seqs"] == list(range(MAX_EVIDENCE)) and raw.count == 10 * MAX_EVIDENCE


def closed(connection: str, seq: int, ts: int, settle_ts: int, channel: int = 1, **fields) -> dict:
    return delivery(connection, seq, ts, channel=channel, outcome="channel_closed", settle_ts_ns=settle_ts,
                    settle_seq=seq + 50, **fields)


def test_a_delivery_left_at_a_close_counts_when_it_comes_back_elsewhere_after_the_close():
    rows = [closed("c1", 10, 0, 100, connection_name="one"),
            delivery("c2", 5, 150, redelivered=True, connection_name=None),
            delivery("c1", 30, 200, channel=2, redelivered=True, connection_name="one")]
    (match,) = redelivered_after_close(rows)
    assert (match.on, match.places, match.close_ns, match.close_seq) == (("c2", "one"), ("c1#2", "c2#1"), 100, 60)
    connection_id, raw = after_close_finding([match])
    assert (connection_id, raw.channel, raw.count, raw.evidence["ended_by"]) == ("c1", 1, 1, "channel_closed")
    assert raw.summary.startswith("1 deliveries left unacked on channel 1 when its channel closed")


def test_no_redelivery_after_close_before_the_close_or_on_the_same_incarnation():
    rows = [closed("c1", 10, 0, 100), delivery("c2", 5, 50, redelivered=True),
            delivery("c1", 11, 150, redelivered=True), delivery("c3", 5, 150, redelivered=False)]
    assert redelivered_after_close(rows) == []
