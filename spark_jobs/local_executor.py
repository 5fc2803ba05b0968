"""The local executor: the pass in the driver's own process (pyarrow and delta-rs, no JVM; one core,
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

from .carried_pass import STATE_COLUMNS, STORED
from .connection_pass import (FLUSH_RECORDS, HEADER, HEADER_SEQ, STATE_TABLE, WIDE, PassSummary, _Partition,
                              pass_summary)
from .findings import facts_in_lake
from .table_files import relative_in_table, spark_location
from .run_scope import RunScope

# Frame rows up to which a run is this executor's: on these machines its one core replays ~150,000
# of them a second (bench/driver_carry.py: the 10 M lake's 5% append, 500,000 frames, in ~3 s),
# where a fresh Spark session takes ~10 s before the pass starts.
DRIVER_FRAMES = 1_000_000

# Rows of each batch the pass is handed: Spark's (spark.sql.execution.arrow.maxRecordsPerBatch).
BATCH_ROWS = 10_000
# The frames' columns as the pass reads them (Spark reads them in the table's types).
FRAME_COLUMNS = pa.schema([schema.FRAMES.field(name) for name in ANALYSIS_COLUMNS])
# The header rows' columns, as connection_pass.connection_pass makes them for a carried pass.
HEADER_COLUMNS = pa.schema([schema.ANALYSIS_STATE.field(name) for name in STATE_COLUMNS]
                           + [(STORED, pa.bool_()), (HEADER, pa.string())])


class LocalExecutor:
    """The pass of one run in this process, over the run's snapshot of `frames`."""
    spark = None
    delta_mode = "none"   # no Spark, no Delta access of its

    def __init__(self, lake: str, plan: RunScope, settings: Settings):
        self.lake, self.plan, self.settings = lake, plan, settings

    def connection_pass(self, keys: list[str] | None, carried: bool = False) -> PassSummary:
        """These connections (None: all) analysed from all their frames, or (`carried`) carried on
        from their checkpoints over the plan's new files."""
        base = spark_location(os.path.join(self.lake, "frames"))
        frames = read_table(self.lake, "frames", FRAME_COLUMNS,
                            where=None if keys is None else pc.field("connection_id").isin(keys),
                            files={relative_in_table(uri, base) for uri in self.plan.new_files} if carried else None,
                            version=self.plan.frames_version)
        if frames is None:
            frames = FRAME_COLUMNS.empty_table()
        ids = sorted(set(pc.unique(frames["connection_id"]).to_pylist()) - {None})
        facts = facts_in_lake(self.lake)(set(ids))
        states = {}
        if carried:
            stored = read_table(self.lake, STATE_TABLE, schema.ANALYSIS_STATE,
                                columns=["connection_id", *STATE_COLUMNS], where=pc.field("connection_id").isin(ids))
            states = {row["connection_id"]: row for row in stored.to_pylist()} if stored is not None else {}
        headers = {key: json.dumps(facts[key]) if key in facts else None for key in ids}
        rows = laid_out(frames, headers, states if carried else None)
        del frames
        partition = _Partition(self.settings, self.plan.frames_version, FLUSH_RECORDS, ADVANCE_EVERY_ROWS, self.lake,
                               carried=carried)
        return pass_summary(pa.Table.from_batches(list(partition.run(iter(rows.to_batches(max_chunksize=BATCH_ROWS)))),
                                                  schema=WIDE))


def laid_out(frames: pa.Table, headers: dict[str, str | None], states: dict[str, dict] | None = None) -> pa.Table:
    """The pass's input as Spark's executor hands it to a partition: frame rows and a header row per
    connection of `headers` (its connection facts as JSON, and in a carried pass its analysis_state
    row's columns from `states`, where it has one), by connection then seq, nulls first as Spark
    sorts them. Its columns are Spark's (a whole pass's header has HEADER only): the checkpoints keep
    some rows whole."""
    for field in HEADER_COLUMNS if states is not None else [HEADER_COLUMNS.field(HEADER)]:
        frames = frames.append_column(field, pa.nulls(frames.num_rows, field.type))
    stored = states or {}
    header_rows = pa.Table.from_pylist([
        {"connection_id": key, "seq": HEADER_SEQ, HEADER: facts, STORED: key in stored,
         **{name: stored.get(key, {}).get(name) for name in STATE_COLUMNS}}
        for key, facts in sorted(headers.items())], schema=frames.schema)
    return pa.concat_tables([header_rows, frames]).sort_by(
        [("connection_id", "ascending", "at_start"), ("seq", "ascending", "at_start")])
