"""The local executor: the passes in the driver's own process (pyarrow and delta-rs, no JVM; one core,
every row of the run in memory), for runs of at most DRIVER_FRAMES frame rows on a local master, where
starting Spark costs more than the pass (docs/analysis.md, "One implementation of the rules"). The rows
Spark would hand a partition, laid out in its order (`laid_out`), go through the same partition code.
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
from .carried_pass import STATE_COLUMNS, STORED, WIDE as CARRIED_WIDE, CarriedPass, _CarriedPartition, carried_summary
from .table_files import relative_in_table, spark_location
from .run_scope import RunScope
from .wide_writes import FILE_ROWS

# Frame rows up to which a run is this executor's: on these machines its one core replays ~150,000
# of them a second (bench/driver_carry.py: the 10 M lake's 5% append, 500,000 frames, in ~3 s),
# where a fresh Spark session takes ~10 s before the pass starts.
DRIVER_FRAMES = 1_000_000

# Rows of each batch the pass is handed: Spark's (spark.sql.execution.arrow.maxRecordsPerBatch).
BATCH_ROWS = 10_000
# The frames' columns as the pass reads them (Spark reads them in the table's types).
FRAME_COLUMNS = pa.schema([schema.FRAMES.field(name) for name in ANALYSIS_COLUMNS])
# The carried pass's header rows' columns, as carried_pass.carry_on makes them.
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
        base = spark_location(os.path.join(self.lake, "frames"))
        frames = read_table(self.lake, "frames", FRAME_COLUMNS, where=pc.field("connection_id").isin(keys),
                            files={relative_in_table(uri, base) for uri in self.plan.new_files},
                            version=self.plan.frames_version)
        stored = read_table(self.lake, STATE_TABLE, schema.ANALYSIS_STATE, columns=["connection_id", *STATE_COLUMNS],
                            where=pc.field("connection_id").isin(keys))
        states = {row["connection_id"]: row for row in stored.to_pylist()} if stored is not None else {}
        headers = {key: json.dumps(row) for key, row in facts_in_lake(self.lake)(set(keys)).items()}
        rows = laid_out(frames, carried_headers(frames, headers, states), CARRIED_HEADER_COLUMNS)
        del frames
        partition = _CarriedPartition(self.settings, self.plan.frames_version, FLUSH_RECORDS, self.lake, FILE_ROWS)
        return carried_summary(run(partition, rows, CARRIED_WIDE), keys)


def whole_pass(lake: str, keys: list[str] | None, settings: Settings, frames_version: int) -> pa.Table:
    """connection_pass.connection_pass with `write_to=lake` in this process: the wide table of these
    connections (None: all) from all their frames at `frames_version`."""
    where = None if keys is None else pc.field("connection_id").isin(keys)
    frames = read_table(lake, "frames", FRAME_COLUMNS, where=where, version=frames_version)
    if frames is None:
        frames = FRAME_COLUMNS.empty_table()
    ids = set(pc.unique(frames["connection_id"]).to_pylist()) - {None}
    headers = [{"connection_id": key, HEADER: json.dumps(row)} for key, row in facts_in_lake(lake)(ids).items()]
    rows = laid_out(frames, headers, pa.schema([(HEADER, pa.string())]))
    del frames
    return run(_Partition(settings, frames_version, FLUSH_RECORDS, ADVANCE_EVERY_ROWS, lake), rows, WIDE)


def carried_headers(frames: pa.Table, headers: dict[str, str], states: dict[str, dict]) -> list[dict]:
    """The carried pass's header row (CARRIED_HEADER_COLUMNS) of each connection of `frames`."""
    ids = sorted(set(pc.unique(frames["connection_id"]).to_pylist()) - {None})
    return [{"connection_id": key, HEADER: headers.get(key), STORED: key in states,
             **{name: states.get(key, {}).get(name) for name in STATE_COLUMNS}} for key in ids]


def laid_out(frames: pa.Table, headers: list[dict], header_columns: pa.Schema) -> pa.Table:
    """The pass's input as Spark's executor hands it to a partition: frame rows and one header row
    per connection (`headers`: its connection_id and `header_columns`), by connection then seq, nulls
    first as Spark sorts them."""
    for field in header_columns:
        frames = frames.append_column(field, pa.nulls(frames.num_rows, field.type))
    header_rows = pa.Table.from_pylist([{**row, "seq": HEADER_SEQ} for row in headers], schema=frames.schema)
    return pa.concat_tables([header_rows, frames]).sort_by(
        [("connection_id", "ascending", "at_start"), ("seq", "ascending", "at_start")])


def run(partition: ConnectionsPartition, rows: pa.Table, wide: pa.Schema) -> pa.Table:
    """The partition over these laid-out rows, in Spark's batch size: its wide table."""
    return pa.Table.from_batches(list(partition.run(iter(rows.to_batches(max_chunksize=BATCH_ROWS)))), schema=wide)
