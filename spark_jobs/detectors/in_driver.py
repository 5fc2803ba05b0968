"""A run's findings computed by the driver, when they are few: one or two small Spark jobs
instead of five or six (on the bench's 10 M-frame lake, 995 findings: seconds of planning and
scheduling for a few thousand rows).

A run that carried every connection on from its checkpoint (incremental.py) computes again only
what its rows can change (scoped.py): its connections' own findings, which the carried pass gave
as raw findings, and the message kinds' findings of the messages its changed delivery rows name,
read from the stored requeue_related deliveries (a few in a hundred: requeue_related.py). On
Spark that is the candidates' scan, the kinds' shuffles, the packets' lookup and the findings'
replace: five jobs and their planning, seconds for a few thousand rows. Here the driver does the
same selections with pyarrow, and hands the rows to the same rules (analyzer/detectors: Journey,
redelivered_after_close, after_close_finding, finish): the carried pass's rows come in one Spark
job (CarriedPass.in_driver), the rest is read from the lake's files.

The evidence packets are found as Spark's path finds them (evidence_packets.KnownPackets): in
the stored findings and the new frames, and for the findings not all of whose frames are there,
by a scan of `frames` (one more Spark job) for just those frames.

A full run does the same with every connection's raw findings (`full_run_findings_in_driver`):
the pass's, in one Spark job, and the message kinds' from every stored candidate (the run wrote
every delivery row: all of them count as changed); no packet is known before the scan, and the
table is replaced whole.

Only when it is small: at most DRIVER_ROWS raw findings and changed rows, CANDIDATE_BYTES of
files to read for the candidates, SCANNED_FRAMES frames to scan for, and (a scheduled run) a
findings table the driver rewrites whole (delta_io.REWRITTEN_WHOLE_BYTES). Otherwise the
functions say no and the run takes Spark's path. tests/test_incremental.py and
tests/test_analyze.py hold the two paths to the same tables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from itertools import groupby, zip_longest

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors import KINDS, RawFinding, finish
from analyzer.detectors.messages import (COLUMNS, JOURNEY_ORDER, Journey, Redelivered, after_close_finding,
                                         left_at_close, redelivered_after_close)
from analyzer.lake import TableWriter, filesystem, open_table, read_table
from spark_jobs.connection_pass import finding_fields
from spark_jobs import delta_io
from spark_jobs.delta_io import Keyed, Listed, Replacement, replace_all
from spark_jobs.evidence_packets import PACKETS
from spark_jobs.incremental import CarriedPass
from spark_jobs.requeue_related import REQUEUE_RELATED, candidates
from spark_jobs.table_files import commit, files_that_may_hold, snapshot_files
from spark_jobs.thresholds import Thresholds
from spark_jobs.timeline.plans import first_day, utc_day
from spark_jobs.timeline.tables import TIMELINE_TABLES

# Raw findings, and changed delivery rows, the driver takes at most (each a few hundred bytes).
DRIVER_ROWS = 100_000
# Evidence frames it scans `frames` for at most.
SCANNED_FRAMES = 10_000
# The most frames the scan's literal lists may pick (every listed seq of every listed connection);
# past it, a broadcast semi-join with the frames' pairs picks them.
LISTED_FRAMES = 10_000
# The stored requeue_related deliveries' files it reads at most (bench/jobs.py's 10 M-frame lake: 4.4 MB).
CANDIDATE_BYTES = 64 << 20
# The connections row's columns the findings take, in the order the first row seen is picked by
# (connection_pass.connection_rows).
CONNECTION_FIELDS = ("first_ts_ns", "agent_id", "connection_name", "client_addr", "client_port", "server_addr",
                     "server_port", "source")

Place = tuple[str, int, int]
Frame = tuple[str, int]   # (connection_id, seq)


def findings_in_driver(lake: str, carried: CarriedPass, keys: list[str], new_files: tuple[str, ...],
                       thresholds: Thresholds, frames_since: Callable[[str | None], DataFrame]) -> bool:
    """The findings table after a run that carried on every one of `keys` (`carried`), its new
    frames in `new_files`, replaced by the driver in one commit; False (nothing written) when it
    is not small enough for the driver (the module's docstring). `frames_since(day)`: the run's
    `frames` from that UTC day on (None: all of it), scanned for the packets nothing else has."""
    findings = open_table(lake, "findings")
    deliveries = open_table(lake, "deliveries")
    if findings is None or deliveries is None or max(carried.raw_rows, carried.requeue_changed_rows) > DRIVER_ROWS:
        return False
    if sum(f.size for f in snapshot_files(findings).values()) > delta_io.REWRITTEN_WHOLE_BYTES:
        return False
    files = _candidate_files(deliveries) if carried.requeue_changed_rows else set()
    if files is None:
        return False
    raw, changed = carried.in_driver(lake)
    raw_rows, across = raw.to_pylist(), []
    replaces = [Listed({"connection_id": tuple(keys), "kind": KINDS})]
    if carried.requeue_changed_rows:
        across, messages, places = _message_kinds(lake, changed, files, deliveries.version(), thresholds)
        replaces += [Listed({"kind": ("requeue_loop",), "message_identity": tuple(sorted(messages))}),
                     Keyed(("kind", "connection_id", "channel", "incarnation"),
                           frozenset(("redelivery_after_close", *place) for place in places))]
    rows = _finished(raw_rows, across, _known(raw_rows + across, read_table(lake, "findings", schema.FINDINGS),
                                              new_files),
                     lambda: frames_since(_first_day(lake, raw_rows, across)))
    if rows is None:
        return False
    replace_all(lake, {"findings": Replacement(rows, schema.FINDINGS, replaces)})
    return True


def full_run_findings_in_driver(lake: str, raw: DataFrame, raw_rows: int, came_back: int, thresholds: Thresholds,
                                frames_since: Callable[[str | None], DataFrame], tag: str | None) -> bool:
    """A full run's findings table, replaced by the driver in one commit when it is small: the
    pass's raw findings (`raw`, RAW_FINDINGS rows, `raw_rows` of them: one Spark job) and the
    message kinds' from every stored candidate (the pass counted `came_back` deliveries they can
    start from: with none there is nothing to read), their packets from one scan of `frames`
    (`_scanned`). False (nothing written) when it is not small (the module's docstring): Spark's
    path then takes it (analyze.py)."""
    if raw_rows > DRIVER_ROWS:
        return False
    across = []
    if came_back:
        deliveries = open_table(lake, "deliveries")
        files = _candidate_files(deliveries)
        if files is None:
            return False
        # The run wrote every delivery row again: all of them count as changed (scoped.py), so
        # the kinds find what they find in the whole table.
        stored = _stored_candidates(lake, files, deliveries.version())
        across, _, _ = _found_across(lake, stored, stored, thresholds)
    raw_list = raw.toArrow().to_pylist() if raw_rows else []
    rows = _finished(raw_list, across, _known(raw_list + across, None, ()), lambda: frames_since(None))
    if rows is None:
        return False
    writer = TableWriter(lake, "findings", schema.FINDINGS)
    writer.write(rows)
    commit(os.path.join(lake, "findings"), schema.FINDINGS, writer.actions, schema.PARTITION_BY, mode="overwrite",
           tag=tag)
    return True


def _candidate_files(deliveries: DeltaTable) -> set[str] | None:
    """The deliveries' files that can hold a candidate of the message kinds (requeue_related.py);
    None where they hold more than CANDIDATE_BYTES, too much for the driver."""
    files = files_that_may_hold(deliveries, REQUEUE_RELATED)
    logged = snapshot_files(deliveries) if files else {}
    return None if sum(logged[path].size for path in files) > CANDIDATE_BYTES else files


def _finished(raw_rows: list[dict], across: list[dict], known: tuple[dict[Frame, tuple], set[Frame]],
              frames: Callable[[], DataFrame]) -> pa.Table | None:
    """schema.FINDINGS rows of the raw findings of both sorts (RAW_FINDINGS rows), `known` their
    packets located and the frames still to find (`_known`), found by one scan of `frames()`;
    None where there are more than SCANNED_FRAMES of them."""
    located, unknown = known
    if len(unknown) > SCANNED_FRAMES:
        return None
    if unknown:
        located.update(_scanned(frames(), unknown))
    return pa.Table.from_pylist([finish(RawFinding(**json.loads(row["finding"])), json.loads(row["connection"]),
                                        lambda seqs, c=row["connection_id"]: [located.get((c, seq)) for seq in seqs])
                                 for row in [*raw_rows, *across]], schema=schema.FINDINGS)


def _message_kinds(lake: str, changed: pa.Table, files: set[str], version: int,
                   thresholds: Thresholds) -> tuple[list[dict], set[str], set[Place]]:
    """scoped.rescoped_findings's message kinds: their raw findings (RAW_FINDINGS rows) computed
    again from the stored candidates (in `files` of the deliveries at `version`: the snapshot they
    were picked in, whatever the compaction beside commits), the messages and closed incarnations
    they replace."""
    changed_rows = [d for d in changed.to_pylist() if d["message_identity"] is not None]
    return _found_across(lake, _stored_candidates(lake, files, version), changed_rows, thresholds)


def _stored_candidates(lake: str, files: set[str], version: int) -> list[dict]:
    """The stored deliveries either message kind reads (messages.candidate), in `files` of the
    deliveries at `version`, with COLUMNS."""
    stored = read_table(lake, "deliveries", TIMELINE_TABLES["deliveries"], columns=[*COLUMNS, REQUEUE_RELATED],
                        where=pc.field(REQUEUE_RELATED).is_null() | pc.field(REQUEUE_RELATED), files=files,
                        version=version)
    return stored.filter(candidates(stored)).select(COLUMNS).to_pylist() if stored is not None else []


def _found_across(lake: str, rows: list[dict], changed_rows: list[dict],
                  thresholds: Thresholds) -> tuple[list[dict], set[str], set[Place]]:
    """The message kinds' raw findings of the messages `changed_rows` (delivery rows with a message
    identity) name, from `rows`, the candidates: as `_message_kinds` gives them."""
    came_back: dict[str, bool] = {}   # each changed message: did it come back (redelivered) in a changed row
    for d in changed_rows:
        came_back[d["message_identity"]] = came_back.get(d["message_identity"], False) or d["redelivered"] is True

    journeys = [d for d in rows if d["message_identity"] in came_back]
    loops = [found for _, group in groupby(sorted(journeys, key=_ordered(("message_identity", *JOURNEY_ORDER))),
                                            key=lambda d: d["message_identity"])
             if (found := _journey(group, thresholds)) is not None]

    closed = [d for d in rows if left_at_close(d)]
    places = ({_place(d) for d in changed_rows if left_at_close(d)}
              | {_place(d) for d in closed if came_back.get(d["message_identity"], False)})
    closed_there = {d["message_identity"] for d in closed if _place(d) in places}
    connections = connections_in_driver(lake, {d["connection_id"] for d in rows})
    involved = [{**d, "connection_name": connections.get(d["connection_id"], {}).get("connection_name")}
                for d in rows if d["message_identity"] in closed_there
                and (left_at_close(d) or d["redelivered"] is True)]
    matches = [m for _, group in groupby(sorted(involved, key=_ordered(("message_identity",))),
                                         key=lambda d: d["message_identity"])
               for m in redelivered_after_close(group)]
    by_place = sorted(matches, key=lambda m: tuple((v is not None, v) for v in (*_as_place(m), m.seq)))
    after_close = [found for place, group in groupby(by_place, key=_as_place)
                   if place in places and (found := after_close_finding(group)) is not None]
    raw = []
    for connection_id, finding in [*loops, *after_close]:
        connection = connections.get(connection_id, {"connection_id": connection_id})
        raw.append({"connection_id": connection_id, "connection": json.dumps(connection), **finding_fields(finding)})
    return raw, set(came_back), places


def _journey(deliveries: Iterable[dict], thresholds: Thresholds) -> tuple[str, RawFinding] | None:
    journey = Journey()
    for d in deliveries:
        journey.add(d)
    return journey.finding(thresholds)


def _place(d: dict) -> Place:
    return d["connection_id"], d["channel"], d["incarnation"]


def _as_place(m: Redelivered) -> Place:
    return m.connection_id, m.channel, m.incarnation


def _ordered(columns: tuple[str, ...]):
    """A sort key on these columns as Spark sorts them ascending: nulls first."""
    return lambda d: tuple((d[c] is not None, d[c]) for c in columns)


def connections_in_driver(lake: str, ids: set[str]) -> dict[str, dict]:
    """connection_pass.connection_rows of these connections, as the dicts their JSON reads back as:
    the row first seen (CONNECTION_FIELDS' order, nulls first), with the last time any agent saw it."""
    table = read_table(lake, "connections", schema.CONNECTIONS, columns=["connection_id", *CONNECTION_FIELDS,
                                                                          "last_ts_ns"],
                       where=pc.field("connection_id").isin(sorted(ids))) if ids else None
    rows = table.to_pylist() if table is not None else []
    out = {}
    for connection_id, group in groupby(sorted(rows, key=_ordered(("connection_id", *CONNECTION_FIELDS))),
                                        key=lambda row: row["connection_id"]):
        group = list(group)
        last = [row["last_ts_ns"] for row in group if row["last_ts_ns"] is not None]
        first = {"connection_id": connection_id, **{c: group[0][c] for c in CONNECTION_FIELDS},
                 "last_ts_ns": max(last) if last else None}
        out[connection_id] = {k: v for k, v in first.items() if v is not None}   # to_json leaves nulls out
    return out


def _known(raw_rows: list[dict], stored: pa.Table | None,
           new_files: tuple[str, ...]) -> tuple[dict[Frame, tuple], set[Frame]]:
    """evidence_packets._known in the driver: the (packet, source) of the frames the findings name,
    from the stored findings and the new frames, for every finding whose frames are all located so
    and its first one's source too; the frames of the others, to scan for (the scan gives all of
    theirs)."""
    named = {(row["connection_id"], tuple(row["seqs"])) for row in raw_rows if row["seqs"]}
    wanted = {(connection_id, seq) for connection_id, seqs in named for seq in seqs}
    if not wanted:
        return {}, set()
    packets: dict[tuple[str, int], int] = {}
    sources: dict[tuple[str, int], str] = {}

    def seen(key: tuple[str, int], packet: int | None, source: str | None) -> None:
        # A frame's packet and source are facts: where two places have one, they are equal (max, as Spark).
        if packet is not None:
            packets[key] = max(packets.get(key, packet), packet)
        if source is not None:
            sources[key] = max(sources.get(key, source), source)

    for row in (stored.select(["connection_id", "source", "evidence"]).to_pylist() if stored is not None else []):
        evidence = json.loads(row["evidence"]) if row["evidence"] is not None else {}
        seqs, located = evidence.get("seqs"), evidence.get("source_packets")
        if not isinstance(seqs, list) or not isinstance(located, list):
            continue
        for pos, (seq, packet) in enumerate(zip_longest(seqs, located)):
            if packet is not None and (row["connection_id"], seq) in wanted:
                seen((row["connection_id"], seq), packet, row["source"] if pos == 0 else None)
    ids = sorted({connection_id for connection_id, _ in wanted})
    for location in new_files:
        fs, path = filesystem(location)
        frames = pq.read_table(path, filesystem=fs, columns=PACKETS, partitioning=None,
                               filters=pc.field("connection_id").isin(ids))
        for row in frames.to_pylist():
            key = (row["connection_id"], row["seq"])
            if key in wanted:
                seen(key, row["source_packet"], row["source"])
    unknown = {(connection_id, seq) for connection_id, seqs in named
               if any((connection_id, seq) not in packets for seq in seqs) or (connection_id, seqs[0]) not in sources
               for seq in seqs}
    return {key: (packet, sources.get(key)) for key, packet in packets.items() if key not in unknown}, unknown


def _scanned(frames: DataFrame, unknown: set[Frame]) -> dict[Frame, tuple]:
    """The (packet, source) of these frames, from a scan of `frames`. Picked by literal lists where
    those name few more frames than these (their bounds let Parquet skip row groups, and there is
    no broadcast, a Spark job of its own); else by a semi-join with these pairs, broadcast: lists of
    many connections and seqs pick every listed seq of every listed connection (the bench's full
    run: 1,186,568 rows for 8,805 frames of 226 connections, 8.4 s against 1.8 s)."""
    ids, seqs = sorted({c for c, _ in unknown}), sorted({seq for _, seq in unknown})
    frames = frames.select(*PACKETS)
    if len(ids) * len(seqs) <= LISTED_FRAMES:
        picked = frames.where(F.col("connection_id").isin(ids) & F.col("seq").isin(seqs))
    else:
        pairs = pa.Table.from_pylist([{"connection_id": c, "seq": seq} for c, seq in sorted(unknown)],
                                     schema=pa.schema([schema.FRAMES.field("connection_id"),
                                                       schema.FRAMES.field("seq")]))
        picked = frames.join(F.broadcast(frames.sparkSession.createDataFrame(pairs)), on=["connection_id", "seq"],
                             how="left_semi")
    return {(row["connection_id"], row["seq"]): (row["source_packet"], row["source"]) for row in picked.collect()
            if (row["connection_id"], row["seq"]) in unknown}


def _first_day(lake: str, raw_rows: list[dict], across: list[dict]) -> str | None:
    """evidence_packets.finished_together's first day to scan `frames` from: the day the first
    carried connection with findings was seen (they were all carried: their frames start then),
    and the first instant of the message kinds' findings (their evidence frames are deliveries
    no earlier); None (all of `frames`) where the connections table does not know one of them."""
    days = []
    if any(row["seqs"] for row in across):
        days.append(utc_day(min(json.loads(row["finding"])["first_ts_ns"] for row in across)))
    if raw_rows:
        # Those with findings (Spark's path takes every carried connection's: an earlier day, the same packets).
        keys = sorted({row["connection_id"] for row in raw_rows})
        seen = read_table(lake, "connections", schema.CONNECTIONS, columns=["connection_id", "first_ts_ns"],
                          where=pc.field("connection_id").isin(keys))
        first = pc.min(seen["first_ts_ns"]).as_py() if seen is not None else None
        known = len(set(seen["connection_id"].to_pylist())) if seen is not None else 0
        days.append(first_day({"known": known, "first_ns": first}, keys))
    return None if None in days else min(days)
