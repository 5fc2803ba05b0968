"""Connections carried from run to run on Spark (the rules: analyzer/timeline/carry.py).

A scheduled run hands each connection's new frames, with its checkpoint (the `analysis_state`
table) and its connections row, to a cogrouped Arrow function that resumes the reference state
machine and the detectors (analyzer/connection_analysis.py's `CarriedAnalysis`): Python per
connection, not per row, and only over the new frames. Out come, as one wide table (wide.py):
the rows to write, the rows they replace (role `stale`), the channel_metrics rows of the
incarnations whose metrics are recomputed from the boundary bucket on (`touched`: they replace
those buckets), the connection's findings before their evidence packets (`raw_findings`, as the
pass gives them), the next checkpoint (`state`), or why the connection must be analysed whole
instead (`fallback`).

Runs that analyse connections whole (the first, `--full`, `--since`, fallbacks) get their
checkpoints from the same pass that writes their tables (connection_pass.py).
"""

from __future__ import annotations

import json
from functools import partial

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, CarriedAnalysis, Settings
from analyzer.timeline.carry import FORMAT, StateError, load
from analyzer.timeline.metrics import to_table as metrics_table
from analyzer.timeline.tables import RECORD_TYPES, to_table

from ..provisional import flagged, metric_flags, open_buckets
from ..connection_pass import (FLUSH_RECORDS, HEADER, RAW_FINDINGS, batch_rows, headers, raw_finding_rows, state_row,
                               states_table)
from ..types import spark_schema
from .tables import CHANNEL_METRICS, TIMELINE_TABLES
from .wide import from_wide, to_wide, wide_schema

WRITE, STALE = "write", "stale"
# A connection new to the run has no stored metrics: its incarnations' buckets are all computed here.
FIRST_BUCKET = -(2**63)
TOUCHED = pa.schema([("connection_id", pa.string()), ("channel", pa.int32()), ("incarnation", pa.int32()),
                     ("from_ns", pa.int64())])
FALLBACK = pa.schema([("connection_id", pa.string()), ("reason", pa.string())])
# A carried connection's new frame rows, and the records its checkpoint held (the run's report).
TALLY = pa.schema([("connection_id", pa.string()), ("frames", pa.int64()), ("carried_records", pa.int64())])
CARRIED_TABLES = {**TIMELINE_TABLES, "channel_metrics": CHANNEL_METRICS, "state": schema.ANALYSIS_STATE,
                  "touched": TOUCHED, "fallback": FALLBACK, "raw_findings": RAW_FINDINGS, "tally": TALLY}
# The right side's column saying the connection has an analysis_state row (it may have only a header).
STORED = "_stored"
WIDE = wide_schema(CARRIED_TABLES)
# The roles a table's rows come in (the others' rows have none).
ROLES = {**{name: (WRITE, STALE) for name in RECORD_TYPES}, "channel_metrics": (WRITE,)}
# Rows handed to the state machine at once (the rest of the connection's new frames wait as Arrow).
FEED_ROWS = 1 << 16


def carry_on(new_frames: DataFrame, states: DataFrame, connections: DataFrame, settings: Settings,
             frames_version: int) -> DataFrame:
    """The wide table for every connection of `new_frames` (ANALYSIS_COLUMNS), for the caller to
    materialise (it is read once per table). `states`: their analysis_state rows; `connections`:
    their schema.CONNECTIONS rows (for the findings, as the pass reads them: connection_pass.headers)."""
    stored = states.select("*", F.lit(True).alias(STORED)).join(
        headers(connections).select("connection_id", HEADER), on="connection_id", how="full")
    return (new_frames.select(*ANALYSIS_COLUMNS).groupBy("connection_id")
            .cogroup(stored.groupBy("connection_id"))
            .applyInArrow(partial(carried_connection, settings, frames_version), spark_schema(WIDE)))


def carried_connection(settings: Settings, frames_version: int, frames: pa.Table, state: pa.Table) -> pa.Table:
    """One connection's wide table: its new frames (ANALYSIS_COLUMNS) fed on from its stored state
    row (with STORED and HEADER; none for a connection new to the run). Its records leave the
    state machine as they become final and are made Arrow FLUSH_RECORDS at a time, so what the
    function holds as Python objects is bounded by that, not by the connection's new frames."""
    if frames.num_rows == 0:
        return WIDE.empty_table()
    connection_id = frames["connection_id"][0].as_py()
    stored = state.to_pylist()[0] if state.num_rows else {}
    connection = json.loads(stored[HEADER]) if stored.get(HEADER) else {"connection_id": connection_id}
    checkpoint = None
    if stored.get(STORED):
        if stored["checkpoint"] is None:
            return _fallback(connection_id, "analysed whole when it had ended (closed or FIN/RST): no checkpoint")
        if stored["format"] != FORMAT:
            return _fallback(connection_id, f"checkpoint format {stored['format']}, not {FORMAT}")
        try:
            checkpoint = load(stored["checkpoint"])
        except StateError as refused:
            return _fallback(connection_id, f"checkpoint refused: {refused}")
    final, opened, metrics, parts = [], [], [], []
    analysis = CarriedAnalysis(checkpoint, connection_id, frames["agent_id"][0].as_py(), settings, final.append,
                               metrics.extend, out_open_record=opened.append)
    for row in _rows(frames):
        analysis.feed(row)
        if len(final) >= FLUSH_RECORDS:
            parts += _records_part(final, WRITE, False)
    done = analysis.finish(connection)
    if done.fallback:
        return _fallback(connection_id, done.fallback)
    parts += [*_records_part(final, WRITE, False), *_records_part(opened, WRITE, True),
              *_records_part(done.stale, STALE, True)]
    flags = metric_flags(metrics, {connection_id: open_buckets(done.checkpoint)} if done.checkpoint else {})
    parts.append(("channel_metrics", WRITE, flagged(metrics_table(metrics), flags)))
    from_ns = FIRST_BUCKET if done.boundary_ns is None else done.boundary_ns
    touched = pa.Table.from_pylist([{"connection_id": connection_id, "channel": channel, "incarnation": incarnation,
                                     "from_ns": from_ns} for channel, incarnation in sorted(done.touched)],
                                   schema=TOUCHED)
    state_rows = states_table([state_row(done.checkpoint, done.timeline, frames_version)])
    tally = pa.Table.from_pylist([{"connection_id": connection_id, "frames": frames.num_rows,
                                   "carried_records": stored.get("carried_records") or 0}], schema=TALLY)
    parts += [("touched", None, touched), ("state", None, state_rows), ("tally", None, tally),
              ("raw_findings", None, pa.Table.from_pylist(raw_finding_rows(connection, done.raw_findings),
                                                          schema=RAW_FINDINGS))]
    return to_wide(WIDE, parts)


def _records_part(records: list, role: str, provisional: bool) -> list[tuple[str, str, pa.Table]]:
    """`records` as the wide table's parts, one per table, emptied (the list is the machine's outlet)."""
    parts = [(name, role, flagged(to_table(records, record_type), provisional))
             for name, record_type in RECORD_TYPES.items()]
    records.clear()
    return parts


def carried_rows(wide: DataFrame, name: str, role: str | None = None) -> DataFrame:
    return from_wide(wide, name, CARRIED_TABLES[name], role)


def _rows(frames: pa.Table):
    """The connection's rows in seq order, as dicts a batch at a time."""
    ordered = frames.select(list(ANALYSIS_COLUMNS)).sort_by("seq")
    for batch in ordered.to_batches(max_chunksize=FEED_ROWS):
        yield from batch_rows(batch)


def _fallback(connection_id: str, reason: str) -> pa.Table:
    return to_wide(WIDE, [("fallback", None, pa.Table.from_pylist([{"connection_id": connection_id, "reason": reason}],
                                                                  schema=FALLBACK))])

