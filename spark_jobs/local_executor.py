"""The local executor: the pass in the driver's own process, with pyarrow and delta-rs, no JVM.

Spark's executor (spark_executor.py) hands the pass its rows shuffled by connection and sorted by
(connection, seq), each connection's header row first (connection_pass.py, timeline/carried.py);
this one reads the same rows from the lake, lays them out in that same order (`laid_out`) and runs
the same partition code over them, one connection after another, in Spark's batch size. What comes
out is the same wide table, the same files written into the lake, uncommitted. One core instead of
all of them, and every row of the run in memory at once: for the work one process does fastest
(a small lake, a small append), where starting Spark would cost more than the pass.

A scheduled run in a fresh process (a CronJob's) spent most of its time starting what Spark needs:
on the 10 M-frame bench lake a 5% append's carried pass was ~3 CPU s of Python and the rest the JVM,
the session, plans made cold and the Python worker (bench/driver_carry.py). So a run that reads at
most DRIVER_FRAMES frame rows is this executor's where the machine is this one (analyze.py's
`local_takes`).
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc

from analyzer import schema
from analyzer.connection_analysis import ADVANCE_EVERY_ROWS, ANALYSIS_COLUMNS, Settings
from analyzer.lake import read_table

from .connection_pass import (FLUSH_RECORDS, HEADER, HEADER_SEQ, STATE_TABLE, WIDE, ConnectionsPartition,
                              PassSummary, _Partition, pass_summary)
from .findings import facts_in_lake
from .carried_pass import CarriedPass, carried_summary
from .table_files import relative_in_table, spark_location
from .timeline import carried
from .run_scope import RunScope
from .timeline.carried import STATE_COLUMNS, STORED, _CarriedPartition
from .wide_writes import FILE_ROWS

# Frame rows up to which a run is this executor's: on these machines its one core replays ~150,000
# of them a second (bench/driver_carry.py: the 10 M lake's 5% append, 500,000 frames, in ~3 s),
# where a fresh Spark session takes ~10 s before the pass starts.
DRIVER_FRAMES = 1_000_000

# Rows of each batch the pass is handed: Spark's (spark.sql.execution.arrow.maxRecordsPerBatch).
BATCH_ROWS = 10_000
# The frames' columns as the pass reads them (Spark reads them in the table's types).
FRAME_COLUMNS = pa.schema([schema.FRAMES.field(name) for name in ANALYSIS_COLUMNS])
# The carried pass's header rows' columns: its connections row as the pass's header JSON, whether
# it has an analysis_state row, and that row's STATE_COLUMNS (timeline/carried.py's `carry_on`).
CARRIED_HEADER_COLUMNS = pa.schema([schema.ANALYSIS_STATE.field(name) for name in STATE_COLUMNS]
                                   + [(STORED, pa.bool_()), (HEADER, pa.string())])


class LocalExecutor:
    """The passes of one run in this process, over the run's snapshot of `frames`."""
    spark = None
    delta_mode = "none"   # no Spark, no Delta access of its

    def __init__(self, lake: str, plan: RunScope, settings: Settings):
        self.lake, self.plan, self.settings = lake, plan, settings

    def whole_pass(self, keys: list[str] | None) -> PassSummary:
        """These connections (None: all) analysed from all their frames."""
        return pass_summary(whole_pass(self.lake, keys, self.settings, self.plan.frames_version))

    def carried_pass(self, keys: list[str]) -> CarriedPass:
        """These connections carried on from their checkpoints over the plan's new files."""
        return carried_pass(self.lake, self.plan.new_files, keys, self.settings, self.plan.frames_version)


def whole_pass(lake: str, keys: list[str] | None, settings: Settings, frames_version: int) -> pa.Table:
    """connection_pass.connection_pass with `write_to=lake`, in this process: every frame of these
    connections (None: of every connection) at `frames_version`, from the start, through the pass
    over whole connections."""
    where = None if keys is None else pc.field("connection_id").isin(keys)
    frames = read_table(lake, "frames", FRAME_COLUMNS, where=where, version=frames_version)
    if frames is None:
        frames = FRAME_COLUMNS.empty_table()
    ids = set(pc.unique(frames["connection_id"]).to_pylist()) - {None}
    headers = [{"connection_id": key, HEADER: json.dumps(row)} for key, row in facts_in_lake(lake)(ids).items()]
    rows = laid_out(frames, headers, pa.schema([(HEADER, pa.string())]))
    del frames
    return run(_Partition(settings, frames_version, FLUSH_RECORDS, ADVANCE_EVERY_ROWS, lake), rows, WIDE)


def carried_pass(lake: str, new_files: tuple[str, ...], keys: list[str], settings: Settings,
                 frames_version: int) -> CarriedPass:
    """The carried pass over the frames of `new_files` of the connections `keys` (their other
    connections are analysed whole), in this process: its files written into the lake's tables,
    uncommitted."""
    frames = new_frames(lake, new_files, frames_version, keys)
    stored = read_table(lake, STATE_TABLE, schema.ANALYSIS_STATE, columns=["connection_id", *STATE_COLUMNS],
                        where=pc.field("connection_id").isin(keys))
    states = {row["connection_id"]: row for row in stored.to_pylist()} if stored is not None else {}
    headers = {key: json.dumps(row) for key, row in facts_in_lake(lake)(set(keys)).items()}
    rows = laid_out(frames, carried_headers(frames, headers, states), CARRIED_HEADER_COLUMNS)
    del frames
    wide = run(_CarriedPartition(settings, frames_version, FLUSH_RECORDS, lake, FILE_ROWS), rows, carried.WIDE)
    return carried_summary(wide, keys)


def carried_headers(frames: pa.Table, headers: dict[str, str], states: dict[str, dict]) -> list[dict]:
    """The carried pass's header row of each connection of `frames` (CARRIED_HEADER_COLUMNS): its
    connections row as the pass's header JSON (`headers`), and its analysis_state row (`states`) if stored."""
    ids = sorted(set(pc.unique(frames["connection_id"]).to_pylist()) - {None})
    return [{"connection_id": key, HEADER: headers.get(key), STORED: key in states,
             **{name: states.get(key, {}).get(name) for name in STATE_COLUMNS}} for key in ids]


def new_frames(lake: str, new_files: tuple[str, ...], frames_version: int, keys: list[str]) -> pa.Table:
    """The rows of the connections `keys` in these files of `frames` at `frames_version` (as the
    run's plan names them), in FRAME_COLUMNS: filtered as the files are read."""
    base = spark_location(os.path.join(lake, "frames"))
    return read_table(lake, "frames", FRAME_COLUMNS, where=pc.field("connection_id").isin(keys),
                      files={relative_in_table(uri, base) for uri in new_files}, version=frames_version)


def laid_out(frames: pa.Table, headers: list[dict], header_columns: pa.Schema) -> pa.Table:
    """The pass's input as Spark's executor hands it to a partition: frame rows (their columns)
    and one header row per connection (`headers`: its connection_id and values of
    `header_columns`, null in frame rows; at seq HEADER_SEQ), by connection then seq, nulls first
    as Spark sorts them."""
    for field in header_columns:
        frames = frames.append_column(field, pa.nulls(frames.num_rows, field.type))
    header_rows = pa.Table.from_pylist([{**row, "seq": HEADER_SEQ} for row in headers], schema=frames.schema)
    return pa.concat_tables([header_rows, frames]).sort_by(
        [("connection_id", "ascending", "at_start"), ("seq", "ascending", "at_start")])


def run(partition: ConnectionsPartition, rows: pa.Table, wide: pa.Schema) -> pa.Table:
    """The partition over these laid-out rows, in Spark's batch size: its wide table."""
    return pa.Table.from_batches(list(partition.run(iter(rows.to_batches(max_chunksize=BATCH_ROWS)))), schema=wide)
