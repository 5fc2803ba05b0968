"""The carried pass: each connection's new frames, its stored state in its header row, through
connection_analysis.CarriedAnalysis, laid out and written as the pass over whole connections
(connection_pass.py; docs/analysis.md, "Incremental", Carried connections); and what it gives a run
(`carried_summary`), whichever executor ran it: the files it wrote, uncommitted, the stored rows they
replace, its findings about one connection, and the connections to analyse whole instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.connection_analysis import ANALYSIS_COLUMNS, CarriedAnalysis, Settings
from analyzer.detectors.messages import COLUMNS
from analyzer.lake import READ_CHECKSUMS, TableWriter, filesystem
from analyzer.timeline.carry import FORMAT, StateError, load
from analyzer.timeline.tables import RECORD_TYPES, to_tables

from .connection_pass import (FLUSH_RECORDS, HEADER, HEADER_SEQ, RAW_FINDINGS, STATE_TABLE, WRITTEN_TABLES,
                              ConnectionsPartition, by_connection, headers, raw_finding_rows, state_row)
from .delta_io import Listed, Match, connections_match
from .provisional import open_buckets
from .requeue_related import REQUEUE_RELATED
from .table_files import adds_that_may_hold, rows_in
from .timeline.tables import TIMELINE_TABLES, as_stored
from .timeline.wide import ROLE, rows_from_wide, wide_schema
from .wide_writes import FILE_ROWS, FILES, add_actions

STALE = "stale"
# A connection new to the run has no stored metrics: its incarnations' buckets are all computed here.
FIRST_BUCKET = -(2**63)
TOUCHED = pa.schema([("connection_id", pa.string()), ("channel", pa.int32()), ("incarnation", pa.int32()),
                     ("from_ns", pa.int64())])
# `streamed`: rows of the connection had left the pass before it fell back.
FALLBACK = pa.schema([("connection_id", pa.string()), ("reason", pa.string()), ("streamed", pa.bool_())])
# A carried connection's new frame rows, and the records its checkpoint held (the run's report).
TALLY = pa.schema([("connection_id", pa.string()), ("frames", pa.int64()), ("carried_records", pa.int64())])
# The timeline tables' rows (role STALE) are those a carried connection's written rows replace.
CARRIED_TABLES = {**TIMELINE_TABLES, "touched": TOUCHED, "fallback": FALLBACK, "raw_findings": RAW_FINDINGS,
                  "tally": TALLY, "files": FILES}
# The header row's column saying the connection has an analysis_state row (it may have only a connections row).
STORED = "_stored"
# The header row's columns of the connection's analysis_state row.
STATE_COLUMNS = ("format", "checkpoint", "carried_records")
WIDE = wide_schema(CARRIED_TABLES)
INCARNATION = ["connection_id", "channel", "incarnation"]
# The stored rows a carried run's rows of each timeline table replace: those equal on these
# columns to the rows it writes, and replaces, of this table. Of deliveries and publishes, those
# are the last run's provisional rows and, so that a run redone never writes a row twice, the rows
# written themselves. Violations: every row of an incarnation whose channels row is written (the
# machine emits an incarnation's violations with its facts).
REPLACED_BY = {"deliveries": ("deliveries", ["connection_id", "seq"]),
               "publishes": ("publishes", ["connection_id", "seq"]),
               "channels": ("channels", INCARNATION), "violations": ("channels", INCARNATION)}


def carry_on(new_frames: DataFrame, states: DataFrame, connections: DataFrame, settings: Settings,
             frames_version: int, write_to: str, partitions: int | None = None, flush_records: int | None = None,
             file_rows: int | None = None) -> DataFrame:
    """The wide table (CARRIED_TABLES) of every connection of `new_frames` (ANALYSIS_COLUMNS), from
    their analysis_state rows (`states`) and connections rows; the tasks write into `write_to`."""
    flush_records = flush_records or FLUSH_RECORDS   # read here: tests set them lower
    file_rows = file_rows or FILE_ROWS

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _CarriedPartition(settings, frames_version, flush_records, write_to, file_rows).run(batches)

    stored = (states.select("connection_id", *STATE_COLUMNS, F.lit(True).alias(STORED))
              .join(headers(connections).select("connection_id", HEADER), on="connection_id", how="full")
              .withColumn("seq", F.lit(HEADER_SEQ).cast("bigint")))
    rows = new_frames.select(*ANALYSIS_COLUMNS).unionByName(stored, allowMissingColumns=True)
    return by_connection(rows, partitions, run_partition, WIDE)


def without_fallbacks(rows: pa.Table, connection_ids: list[str]) -> pa.Table:
    """The wide table's rows without any row of these connections."""
    if not connection_ids:
        return rows
    of_connection = pc.coalesce(*[pc.struct_field(rows[name], "connection_id")
                                  for name, table in CARRIED_TABLES.items() if "connection_id" in table.names])
    # A row of no connection (`files`: each file's rows are the pass's to keep right) stays.
    return rows.filter(pc.or_kleene(pc.is_null(of_connection),
                                    pc.invert(pc.is_in(of_connection, pa.array(connection_ids, pa.string())))))


class _Carrying:
    """One connection of a partition on its way through CarriedAnalysis (or refused before it)."""

    def __init__(self, connection_id: str, header: dict | None, analysis: CarriedAnalysis | None,
                 refused: str | None, marks: tuple[int, int]):
        self.connection_id, self.analysis, self.refused = connection_id, analysis, refused
        header = header or {}  # not kept: it holds the checkpoint's bytes, read once into `analysis`
        self.connection = json.loads(header[HEADER]) if header.get(HEADER) else {"connection_id": connection_id}
        self.carried_records = header.get("carried_records") or 0   # what the checkpoint held
        self.marks = marks          # the partition's records and metric rows gathered before this connection's
        self.streamed = False       # some of its rows left in a flush
        self.frames = 0

    def feed_from(self, rows: list, at: int, stop: int) -> int:
        """CarriedAnalysis.feed_from (one row at a time if refused), counted."""
        done = at + 1 if self.analysis is None else self.analysis.feed_from(rows, at, stop)
        self.frames += done - at
        return done


class _CarriedPartition(ConnectionsPartition):
    """Each connection through CarriedAnalysis, records out in batches."""

    tables, wide = CARRIED_TABLES, WIDE

    def __init__(self, settings: Settings, frames_version: int, flush_records: int, write_to: str, file_rows: int):
        super().__init__(flush_records, write_to, file_rows, ("touched", "tally", "raw_findings", "fallback"))
        self.settings, self.frames_version = settings, frames_version
        self.final: list = []   # these three as `metrics`: emptied in place, never replaced
        self.opened: list = []
        self.stale: list = []

    def _start(self, connection_id: str, first: dict, header: dict | None) -> _Carrying:
        checkpoint, refused = None, None
        if header is not None and header.get(STORED):
            if header["checkpoint"] is None:
                refused = "no checkpoint: it had ended (closed or FIN/RST) or its frame times went back"
            elif header["format"] != FORMAT:
                refused = f"checkpoint format {header['format']}, not {FORMAT}"
            else:
                try:
                    checkpoint = load(header["checkpoint"])
                except StateError as error:
                    refused = f"checkpoint refused: {error}"
        analysis = None if refused else CarriedAnalysis(checkpoint, connection_id, first["agent_id"], self.settings,
                                                        self.final.append, self.metrics.extend,
                                                        out_open_record=self.opened.append)
        return _Carrying(connection_id, header, analysis, refused, (len(self.final), len(self.metrics)))

    def _buffered(self) -> int:
        return len(self.final) + len(self.opened) + len(self.stale) + len(self.metrics)

    def _finish(self, carrying: _Carrying) -> None:
        connection_id = carrying.connection_id
        done = carrying.analysis.finish(carrying.connection) if carrying.analysis is not None else None
        fallback = carrying.refused or done.fallback
        if fallback:
            del self.final[carrying.marks[0]:], self.metrics[carrying.marks[1]:]
            if carrying.streamed:
                for writer in self.writers.values():
                    writer.drop(connection_id)
            self.rows["fallback"].append({"connection_id": connection_id, "reason": fallback,
                                          "streamed": carrying.streamed})
            return
        self.stale += done.stale
        if done.checkpoint is not None:
            self.open_buckets[connection_id] = open_buckets(done.checkpoint)
        from_ns = FIRST_BUCKET if done.boundary_ns is None else done.boundary_ns
        self.rows["touched"] += [{"connection_id": connection_id, "channel": channel, "incarnation": incarnation,
                                  "from_ns": from_ns} for channel, incarnation in sorted(done.touched)]
        self.rows[STATE_TABLE].append(state_row(done.checkpoint, done.timeline, self.frames_version))
        self.rows["tally"].append({"connection_id": connection_id, "frames": carrying.frames,
                                   "carried_records": carrying.carried_records})
        self.rows["raw_findings"] += raw_finding_rows(carrying.connection, done.raw_findings)

    def _flush(self) -> Iterator[pa.RecordBatch]:
        current = self.current
        if current is not None:  # what it gathered leaves now: should it fall back, the caller drops it
            current.streamed = current.streamed or (len(self.final), len(self.metrics)) != current.marks
            current.marks = (0, 0)
        if not (self.final or self.opened or self.stale or self.metrics or any(self.rows.values())):
            return
        final, opened, stale = (to_tables(records, ordered=False) for records in (self.final, self.opened, self.stale))
        self._write_records(final, opened)
        for gathered in (self.final, self.opened, self.stale):
            gathered.clear()
        yield from self._rows_out([(name, STALE, as_stored(name, stale[name], True)) for name in RECORD_TYPES])


@dataclass
class CarriedPass:
    """What the carried pass gives the run (`carried_summary`)."""
    written: dict[str, list[AddAction]]   # per table of WRITTEN_TABLES
    stale: pa.Table                       # the wide table's stored timeline rows the written ones replace
    touched: pa.Table                     # TOUCHED: incarnations whose channel_metrics are recomputed
    raw: pa.Table                         # their findings about one connection (RAW_FINDINGS)
    fallbacks: dict[str, str]             # connection -> why it must be analysed whole
    carried_keys: list[str]               # the connections carried on
    frames: int                           # new frame rows read for the carried connections
    records: int                          # records their checkpoints held

    @property
    def connections(self) -> int:
        return len(self.carried_keys)

    @property
    def whole_keys(self) -> list[str]:
        return sorted(self.fallbacks)

    @property
    def rows(self) -> dict[str, int]:
        """Rows written per table (analysis_state's aside: a run reports the others)."""
        return {name: rows_in(self.written.get(name, [])) for name in WRITTEN_TABLES if name != STATE_TABLE}

    def replaced(self, lake: str, name: str) -> list[Match | Listed]:
        """The stored rows of table `name` its written rows replace, their keys in Arrow: the keys
        of the rows it wrote (read from its files by the driver) and of the stale rows."""
        if name == "channel_metrics":   # the touched incarnations' buckets from the carried one on
            return [Match(self.touched, tuple(INCARNATION), ("bucket_start_ns", "from_ns"))]
        if name == STATE_TABLE:
            return [connections_match(self.carried_keys)]
        table, columns = REPLACED_BY[name]
        keys = pa.schema([TIMELINE_TABLES[table].field(column) for column in columns])
        fs, root = filesystem(f"{lake.rstrip('/')}/{table}")
        written = [pq.read_table(f"{root}/{add.path}", columns=keys.names, filesystem=fs, partitioning=None,
                                 **READ_CHECKSUMS).cast(keys) for add in self.written.get(table, [])]
        return [Match(pa.concat_tables([keys.empty_table(), *written, rows_from_wide(self.stale, table, keys)]),
                      tuple(columns))]

    def changed(self, lake: str) -> pa.Table:
        """What it changes of what the message kinds read, in their COLUMNS: the requeue_related
        delivery rows it replaced (stale) and wrote (read from the files that may hold one)."""
        deliveries = TIMELINE_TABLES["deliveries"]
        writer = TableWriter(lake, "deliveries", deliveries)
        parts = [rows_from_wide(self.stale, "deliveries", deliveries),
                 *[writer.read_file(add.path, add.partition_values["date"])
                   for add in adds_that_may_hold(self.written.get("deliveries", []), REQUEUE_RELATED)]]
        return pa.concat_tables([part.filter(pc.fill_null(part[REQUEUE_RELATED], False)).select(COLUMNS)
                                 for part in parts])

    def discard(self, lake: str) -> None:
        """The files the pass wrote deleted (no log names them)."""
        for name, adds in self.written.items():
            fs, root = filesystem(f"{lake.rstrip('/')}/{name}")
            for add in adds:
                fs.delete_file(f"{root}/{add.path}")


def carried_summary(rows: pa.Table, keys: list[str]) -> CarriedPass:
    """The carried pass's wide table (Spark's collected, or the local executor's) over the
    connections `keys`, without the rows of a connection that fell back after some had left the pass
    (`streamed`: the pass took those it wrote back out of its files)."""
    fallback = rows_from_wide(rows, "fallback")
    rows = without_fallbacks(rows, pc.filter(fallback["connection_id"], fallback["streamed"]).to_pylist())
    fallbacks = dict(zip(fallback["connection_id"].to_pylist(), fallback["reason"].to_pylist()))
    written = add_actions(rows_from_wide(rows, "files", FILES).to_pylist())
    tally = rows_from_wide(rows, "tally", TALLY)
    return CarriedPass({name: written.get(name, []) for name in WRITTEN_TABLES},
                       rows.filter(pc.equal(rows[ROLE], STALE)), rows_from_wide(rows, "touched", TOUCHED),
                       rows_from_wide(rows, "raw_findings", RAW_FINDINGS), fallbacks,
                       [key for key in keys if key not in fallbacks], frames=pc.sum(tally["frames"]).as_py() or 0,
                       records=pc.sum(tally["carried_records"]).as_py() or 0)
