"""The pipeline's findings step, written once for both executors: the findings a run's rows can
change, computed again and committed (analyze.py calls it after the per-connection tables).

In: the raw findings about one connection (connection_pass.RAW_FINDINGS) of the connections the
run analysed (the pass's, the carried pass's, or, for new thresholds, stored_findings.py's), and
the delivery rows it changed (cross_connection_findings.py's docstring). Then, in Arrow:
1. the message kinds' findings (cross_connection_findings.findings_across) from the stored
   candidates, read from only the deliveries' files that can hold one (requeue_related.py), and
   the changed rows;
2. their evidence packets: known from the stored findings and the run's new frames
   (evidence_packets.known_packets; a full run knows none), the rest found by one scan of
   `frames` (a Spark job: the local executor starts Spark only for it);
3. each raw finding finished (analyzer.detectors.finish), and the stored findings they replace
   (every kind about one connection of the analysed connections; requeue_loop of the changed
   rows' messages; redelivery_after_close of the incarnations computed again) replaced in one
   commit; a full run replaces the table whole.

An executor only hands its rows in: the local one in Arrow; Spark's, a connection analysed whole
having changed every delivery row it wrote (millions, maybe), gathers of those only what the kinds
read (candidates, and rows of a message a stored candidate or requeue_loop finding names:
`gathered`). A findings table too large to be rewritten by the driver is patched by Spark
(delta_io.replace_matching), the local executor starting it then.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors import KINDS, RawFinding, finish
from analyzer.detectors.messages import COLUMNS, candidates
from analyzer.detectors.thresholds import Thresholds
from analyzer.lake import READ_CHECKSUMS, TableWriter, filesystem, open_table, read_table, reading

from .connection_pass import CONNECTION_COLUMNS, connection_facts
from .cross_connection_findings import CANDIDATES, findings_across
from .delta_io import REWRITTEN_WHOLE_BYTES, Keyed, Listed, Replacement, replace_all, rewrite_all_in_driver
from .evidence_packets import PACKETS, Frame, known_packets
from .requeue_related import REQUEUE_RELATED
from .session import commit_tag
from .table_files import commit, files_that_may_hold, snapshot_files
from .timeline.plans import first_day, utc_day
from .timeline.tables import TIMELINE_TABLES
from .types import spark_schema

# The most frames the scan's literal lists may pick (every listed seq of every listed connection);
# past it, a broadcast semi-join with the frames' pairs picks them.
LISTED_FRAMES = 10_000

Changed = list[pa.Table | DataFrame]


def refresh_findings(lake: str, own: pa.Table, keys: list[str] | None, changed: Changed | None,
                     thresholds: Thresholds, new_files: tuple[str, ...],
                     frames_since: Callable[[str | None], DataFrame], spark: Callable[[], SparkSession]) -> None:
    """The findings table after a run (the module's docstring). `own`: the raw findings about one
    connection of `keys`, the connections analysed (None: every connection; the table is
    replaced whole). `changed`: the delivery rows the run added or deleted that the message
    kinds can read, in parts (Arrow, or Spark tables); [] where there are none (the kinds have
    nothing to do and read nothing); None: every stored candidate counts as changed.
    `new_files`: the run's new frames files, where packets are looked for before a scan;
    `frames_since(day)`: the run's `frames` from that UTC day on (None: all of it), scanned for the
    rest; `spark()`: the session, for a findings table Spark must patch."""
    deliveries = open_table(lake, "deliveries")
    found = None
    if deliveries is not None and changed != []:
        stored = stored_candidates(lake, deliveries)
        rows = None if changed is None else _changed_rows(lake, changed, stored)
        found = findings_across(stored, rows, facts_in_lake(lake), thresholds)
    raw = own.to_pylist() + (found.raw.to_pylist() if found is not None else [])
    named = [(row["connection_id"], row["seqs"]) for row in raw if row["seqs"]]
    if keys is None:   # nothing is known without the scan, and every connection's frames are read
        located, unknown = {}, {(c, seq) for c, seqs in named for seq in seqs}
        since = None
    else:
        located, unknown = _known(lake, named, new_files)
        since = _first_day(lake, own.to_pylist(), found.raw.to_pylist() if found is not None else []) \
            if unknown else None
    if unknown:
        located.update(_scanned(frames_since(since), unknown))
    rows = pa.Table.from_pylist([finish(RawFinding(**json.loads(row["finding"])), json.loads(row["connection"]),
                                        lambda seqs, c=row["connection_id"]: [located.get((c, seq)) for seq in seqs])
                                 for row in raw], schema=schema.FINDINGS)
    if keys is None:
        writer = TableWriter(lake, "findings", schema.FINDINGS)
        writer.write(rows)
        commit(os.path.join(lake, "findings"), schema.FINDINGS, writer.actions, schema.PARTITION_BY, mode="overwrite",
               tag=commit_tag())
        return
    replaces = [Listed({"connection_id": tuple(keys), "kind": KINDS})]
    if found is not None and found.messages:
        replaces.append(Listed({"kind": ("requeue_loop",), "message_identity": tuple(sorted(found.messages))}))
    if found is not None and found.places:
        replaces.append(Keyed(("kind", "connection_id", "channel", "incarnation"),
                              frozenset(("redelivery_after_close", *place) for place in found.places)))
    _replace(lake, rows, replaces, spark)


def stored_candidates(lake: str, deliveries) -> pa.Table:
    """The stored deliveries that may be candidates (CANDIDATES' columns, with REQUEUE_RELATED),
    read from only the files that can hold one, of the deliveries' snapshot `deliveries` (whatever
    a compaction beside commits meanwhile)."""
    files = files_that_may_hold(deliveries, REQUEUE_RELATED)
    stored = read_table(lake, "deliveries", TIMELINE_TABLES["deliveries"], columns=[*COLUMNS, REQUEUE_RELATED],
                        where=pc.field(REQUEUE_RELATED).is_null() | pc.field(REQUEUE_RELATED), files=files,
                        version=deliveries.version()) if files else None
    return stored if stored is not None else CANDIDATES.empty_table()


def _changed_rows(lake: str, changed: Changed, stored: pa.Table) -> pa.Table:
    """The changed rows in Arrow (their COLUMNS); of a Spark table, only those `gathered` picks."""
    parts = [part.select(list(COLUMNS)) for part in changed if isinstance(part, pa.Table)]
    spark_parts = [part for part in changed if isinstance(part, DataFrame)]
    if spark_parts:
        loops = read_table(lake, "findings", schema.FINDINGS, columns=["message_identity"],
                           where=pc.field("kind") == "requeue_loop")
        among = set(stored["message_identity"].to_pylist())
        among |= set(loops["message_identity"].to_pylist()) if loops is not None else set()
        parts += [gathered(part, among) for part in spark_parts]
    return pa.concat_tables([part.cast(CANDIDATES) for part in parts]) if parts else CANDIDATES.empty_table()


def gathered(changed: DataFrame, among: set[str]) -> pa.Table:
    """Of these (changed) delivery rows, in the driver: the candidates (picked by the one rule in
    Spark's tasks), and the rows of the messages `among` names (the stored candidates' and
    requeue_loop findings'), the only others findings_across reads. One Spark job."""
    known = changed.where(F.col("message_identity").isNotNull()).select(*COLUMNS)

    def picked(batches):
        for batch in batches:
            yield batch.filter(candidates(batch))

    rows = known.mapInArrow(picked, known.schema)
    if among:
        spark = changed.sparkSession
        messages = spark.createDataFrame(pa.table({"message_identity": pa.array(sorted(among), pa.string())}))
        rows = rows.unionByName(known.join(F.broadcast(messages), on="message_identity", how="left_semi"))
    return rows.toArrow()


def facts_in_lake(lake: str) -> Callable[[set[str]], dict[str, dict]]:
    """connection_pass.connection_facts of some connections, read from the lake's connections table."""
    def facts(ids: set[str]) -> dict[str, dict]:
        return connection_facts(read_table(lake, "connections", schema.CONNECTIONS, columns=CONNECTION_COLUMNS,
                                           where=pc.field("connection_id").isin(sorted(ids))) if ids else None)
    return facts


def _known(lake: str, named: list[tuple[str, list[int]]],
           new_files: tuple[str, ...]) -> tuple[dict[Frame, tuple], set[Frame]]:
    """evidence_packets.known_packets of these findings, from the stored findings of their
    connections and the new frames (read from their files, of those connections only)."""
    ids = sorted({connection_id for connection_id, _ in named})
    if not ids:
        return {}, set()
    stored = read_table(lake, "findings", schema.FINDINGS, columns=["connection_id", "source", "evidence"],
                        where=pc.field("connection_id").isin(ids))
    return known_packets(named, stored, (_frames_file(location, ids) for location in new_files))


def _frames_file(location: str, ids: list[str]) -> pa.Table:
    fs, path = filesystem(location)
    with reading(location):
        return pq.read_table(path, filesystem=fs, columns=PACKETS, partitioning=None,
                             filters=pc.field("connection_id").isin(ids), **READ_CHECKSUMS)


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


def _first_day(lake: str, own: list[dict], across: list[dict]) -> str | None:
    """The first day to scan `frames` from: the day the first connection with findings about
    itself was seen (an analysed connection's frames start then), and the first instant of the
    message kinds' findings (their evidence frames are deliveries no earlier); None (all of
    `frames`) where the connections table does not know one of them."""
    days = []
    if any(row["seqs"] for row in across):
        days.append(utc_day(min(json.loads(row["finding"])["first_ts_ns"] for row in across)))
    if own:
        keys = sorted({row["connection_id"] for row in own})
        seen = read_table(lake, "connections", schema.CONNECTIONS, columns=["connection_id", "first_ts_ns"],
                          where=pc.field("connection_id").isin(keys))
        first = pc.min(seen["first_ts_ns"]).as_py() if seen is not None else None
        known = len(set(seen["connection_id"].to_pylist())) if seen is not None else 0
        days.append(first_day({"known": known, "first_ns": first}, keys))
    return None if None in days else min(days)


def _replace(lake: str, rows: pa.Table, replaces: list[Listed | Keyed], spark: Callable[[], SparkSession]) -> None:
    """The findings `replaces` names deleted and `rows` added, in one commit: by the driver where
    the table is small enough to be rewritten whole (delta_io.REWRITTEN_WHOLE_BYTES), else by Spark."""
    table = open_table(lake, "findings")
    if table is None or sum(f.size for f in snapshot_files(table).values()) <= REWRITTEN_WHOLE_BYTES:
        rewrites = rewrite_all_in_driver(lake, {"findings": Replacement(rows, schema.FINDINGS, replaces)})
        if rewrites is not None:
            rewrites["findings"].commit()
            return
    session = spark()   # started (the local executor's): Spark patches the table's files
    replace_all(lake, {"findings": Replacement(session.createDataFrame(rows, spark_schema(schema.FINDINGS)),
                                               schema.FINDINGS, replaces)})
