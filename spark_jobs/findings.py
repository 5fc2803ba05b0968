"""The pipeline's findings step, written once for both executors and run in the driver over Arrow,
with no Spark session (docs/analysis.md, "Incremental": Findings): the message kinds' findings from
the stored candidates and the changed rows, their evidence packets, then every raw finding finished
and committed, replacing the stored findings it replaces (a full run: the table whole).
"""

from __future__ import annotations

import json
import os
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from analyzer import schema
from analyzer.detectors import KINDS, RawFinding, finish
from analyzer.detectors.common import day
from analyzer.detectors.messages import COLUMNS, candidates
from analyzer.detectors.thresholds import Thresholds
from analyzer.lake import Bounds, TableWriter, any_within, open_table, read_table, scan

from .connection_pass import CONNECTION_COLUMNS, connection_facts
from .cross_connection_findings import CANDIDATES, findings_across
from .delta_io import Listed, Match, Replacement, rewrite
from .evidence_packets import FRAME_KEYS, PACKETS, Frame, known_packets
from .requeue_related import REQUEUE_RELATED
from .session import commit_tag
from .table_files import commit, files_that_may_hold, relative_in_table, spark_location
from .timeline.plans import first_day
from .timeline.tables import TIMELINE_TABLES


@dataclass(frozen=True)
class Changed:
    """The delivery rows a run added or deleted that the message kinds can read: `rows` (at least
    COLUMNS), and every stored row of the connections `whole`, analysed whole."""
    rows: tuple[pa.Table, ...] = ()
    whole: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.whole) or any(part.num_rows for part in self.rows)


def refresh_findings(lake: str, own: pa.Table, keys: list[str] | None, changed: Changed | None,
                     thresholds: Thresholds, new_files: tuple[str, ...], frames_version: int | None) -> None:
    """`own`: the raw findings about one connection of `keys` (None: every connection, the table
    replaced whole). `changed` empty: the kinds have nothing to do and read nothing; None: every
    stored candidate counts as changed. `frames_version` None: the current snapshot."""
    deliveries = open_table(lake, "deliveries")
    found = None
    if deliveries is not None and (changed is None or changed):
        stored = stored_candidates(lake, deliveries)
        rows = None if changed is None else _changed_rows(lake, changed, stored, deliveries.version())
        found = findings_across(stored, rows, facts_in_lake(lake), thresholds)
    own_rows, across = own.to_pylist(), (found.raw.to_pylist() if found is not None else [])
    raw = own_rows + across
    named = [(row["connection_id"], row["seqs"]) for row in raw if row["seqs"]]
    if keys is None:   # nothing is known without the scan, and every connection's frames are read
        located, unknown = {}, {(c, seq) for c, seqs in named for seq in seqs}
        since = None
    else:
        located, unknown = _known(lake, named, new_files, frames_version)
        since = _first_day(lake, own_rows, across) if unknown else None
    if unknown:
        located.update(_scanned(lake, frames_version, since, unknown))
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
        on = ("kind", "connection_id", "channel", "incarnation")
        places = [dict(zip(on, ("redelivery_after_close", *place))) for place in found.places]
        replaces.append(Match(pa.Table.from_pylist(places), on))
    rewrite(lake, "findings", Replacement(rows, schema.FINDINGS, replaces)).commit()


def stored_candidates(lake: str, deliveries) -> pa.Table:
    """The stored deliveries that may be candidates, read from only the files that can hold one, of
    the snapshot `deliveries` (whatever a compaction beside commits meanwhile)."""
    files = files_that_may_hold(deliveries, REQUEUE_RELATED)
    stored = read_table(lake, "deliveries", TIMELINE_TABLES["deliveries"], columns=[*COLUMNS, REQUEUE_RELATED],
                        where=pc.field(REQUEUE_RELATED).is_null() | pc.field(REQUEUE_RELATED), files=files,
                        version=deliveries.version()) if files else None
    return stored if stored is not None else CANDIDATES.empty_table()


def _changed_rows(lake: str, changed: Changed, stored: pa.Table, version: int) -> pa.Table:
    parts = [part.select(list(COLUMNS)) for part in changed.rows]
    if changed.whole:
        loops = read_table(lake, "findings", schema.FINDINGS, columns=["message_identity"],
                           where=pc.field("kind") == "requeue_loop")
        among = set(stored["message_identity"].to_pylist())
        among |= set(loops["message_identity"].to_pylist()) if loops is not None else set()
        parts.append(_of_connections(lake, version, changed.whole, among - {None}))
    return pa.concat_tables([part.cast(CANDIDATES) for part in parts]) if parts else CANDIDATES.empty_table()


def _of_connections(lake: str, version: int, keys: tuple[str, ...], among: set[str]) -> pa.Table:
    """Of the delivery rows of these connections: the candidates, and the rows of the messages `among`
    names (the stored candidates' and requeue_loop findings'), the only others findings_across reads."""
    ids = sorted(keys)
    listed, messages = pa.array(ids, pa.string()), pa.array(sorted(among), pa.string())
    picked = [CANDIDATES.empty_table()]
    for _, batch in scan(lake, "deliveries", TIMELINE_TABLES["deliveries"], list(COLUMNS), version=version,
                         bounded=("connection_id",),
                         may_hold=lambda bounds: any_within(ids, bounds.get("connection_id"))):
        ours = batch.filter(pc.is_in(batch["connection_id"], value_set=listed))
        if ours.num_rows:
            read = pc.or_(candidates(ours), pc.is_in(ours["message_identity"], value_set=messages))
            picked.append(ours.filter(read).cast(CANDIDATES))
    return pa.concat_tables(picked)


def facts_in_lake(lake: str) -> Callable[[set[str]], dict[str, dict]]:
    def facts(ids: set[str]) -> dict[str, dict]:
        return connection_facts(read_table(lake, "connections", schema.CONNECTIONS, columns=CONNECTION_COLUMNS,
                                           where=pc.field("connection_id").isin(sorted(ids))) if ids else None)
    return facts


def _known(lake: str, named: list[tuple[str, list[int]]], new_files: tuple[str, ...],
           version: int | None) -> tuple[dict[Frame, tuple], set[Frame]]:
    """evidence_packets.known_packets of these findings, from the stored findings of their
    connections and their frames in `new_files`."""
    ids = sorted({connection_id for connection_id, _ in named})
    if not ids:
        return {}, set()
    stored = read_table(lake, "findings", schema.FINDINGS, columns=["connection_id", "source", "evidence"],
                        where=pc.field("connection_id").isin(ids))
    base = spark_location(os.path.join(lake, "frames"))
    new = read_table(lake, "frames", schema.FRAMES, columns=PACKETS, where=pc.field("connection_id").isin(ids),
                     files={relative_in_table(uri, base) for uri in new_files}, version=version)
    return known_packets(named, stored, [new] if new is not None else [])


def _scanned(lake: str, version: int | None, since: str | None, unknown: set[Frame]) -> dict[Frame, tuple]:
    """The (packet, source) of these frames, from one scan of `frames` from the UTC day `since` on
    (None: all of it)."""
    by_connection: dict[str, list[int]] = {}
    for connection_id, seq in sorted(unknown):
        by_connection.setdefault(connection_id, []).append(seq)
    pairs = pa.Table.from_pylist([{"connection_id": c, "seq": seq} for c, seq in sorted(unknown)], schema=FRAME_KEYS)
    ids, seqs = pairs["connection_id"].unique(), pairs["seq"].unique()
    located = {}
    for _, batch in scan(lake, "frames", schema.FRAMES, PACKETS, version=version, since=since,
                         bounded=("connection_id", "seq"), may_hold=_may_hold(by_connection)):
        listed = batch.filter(pc.and_(pc.is_in(batch["connection_id"], value_set=ids),
                                      pc.is_in(batch["seq"], value_set=seqs)))
        if listed.num_rows:
            for row in listed.join(pairs, keys=["connection_id", "seq"], join_type="left semi",
                                   use_threads=False).to_pylist():
                located[(row["connection_id"], row["seq"])] = (row["source_packet"], row["source"])
    return located


def _may_hold(by_connection: dict[str, list[int]]) -> Callable[[Bounds], bool]:
    """lake.scan's `may_hold`: may frames with these connection_id and seq bounds hold a wanted frame?"""
    ids = sorted(by_connection)

    def may_hold(bounds: Bounds) -> bool:
        low, high = bounds.get("connection_id") or (None, None)
        try:
            first = bisect_left(ids, low) if low is not None else 0
            last = bisect_right(ids, high) if high is not None else len(ids)
        except TypeError:
            first, last = 0, len(ids)
        return any(any_within(by_connection[c], bounds.get("seq")) for c in ids[first:last])

    return may_hold


def _first_day(lake: str, own: list[dict], across: list[dict]) -> str | None:
    """The first day to scan `frames` from: the day the first connection with findings about
    itself was seen (an analysed connection's frames start then), and the first instant of the
    message kinds' findings (their evidence frames are deliveries no earlier); None (all of
    `frames`) where the connections table does not know one of them."""
    days = []
    if any(row["seqs"] for row in across):
        days.append(day(min(json.loads(row["finding"])["first_ts_ns"] for row in across)))
    if own:
        keys = sorted({row["connection_id"] for row in own})
        seen = read_table(lake, "connections", schema.CONNECTIONS, columns=["connection_id", "first_ts_ns"],
                          where=pc.field("connection_id").isin(keys))
        first = pc.min(seen["first_ts_ns"]).as_py() if seen is not None else None
        known = len(set(seen["connection_id"].to_pylist())) if seen is not None else 0
        days.append(first_day({"known": known, "first_ns": first}, keys))
    return None if None in days else min(days)
