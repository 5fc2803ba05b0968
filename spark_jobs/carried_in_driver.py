"""A scheduled run's connections carried on by the driver itself, with no JVM.

A scheduled run in a fresh process (a CronJob's) spent most of its time starting what Spark needs:
on the 10 M-frame bench lake a 5% append's run cost 0.21 of a full run, of which the carried
pass's Python was ~3 CPU s and the rest the JVM, the session, plans made cold and the Python
worker (bench/README.md, sessions 49 and 50). So when the new frames are few (DRIVER_FRAMES), the
driver does the carried pass on its own: it reads the new frames files and its connections'
analysis_state and connections rows (pyarrow, delta-rs), lays them out as Spark's shuffle and
sort hand them to the pass (`carried_layout`: one connection after another, its header row
first, then its frames by seq) and runs the same partition over them (timeline/carried.py's
`_CarriedPartition`: the same machine, the same files written into the lake's folders,
uncommitted). What the run's commits and findings need of the pass's wide rows is read from them
in Arrow (`DriverCarried`). One core instead of all of them: worth it only while the pass is
shorter than starting Spark, hence the bound.

A connection that cannot be carried on (it must be analysed whole: `fallbacks`) is left to Spark:
the caller deletes what the pass wrote (`DriverCarried.discard`) and runs Spark's path, which
carries the others on and analyses that one whole. analyze.py decides when the driver's path is
taken (analyze_without_spark) and commits what it wrote; tests/test_carried_in_driver.py holds
it to the tables Spark's path writes.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction

from analyzer import schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, Settings
from analyzer.lake import filesystem, read_table

from .connection_pass import FLUSH_RECORDS, HEADER, HEADER_SEQ, RAW_FINDINGS, STATE_TABLE, WRITTEN_TABLES
from .findings import facts_in_lake
from .incremental import changed_in_driver
from .table_files import relative_in_table, rows_in, spark_location
from .timeline.carried import STALE, STATE_COLUMNS, STORED, WIDE, _CarriedPartition
from .timeline.tables import TIMELINE_TABLES
from .timeline.wide import RECORD, ROLE, rows_from_wide
from .wide_writes import FILE_ROWS, FILES, add_actions

# New frame rows up to which the driver carries a run's connections on itself: on these machines
# its one core replays ~150,000 of them a second (bench/driver_carry.py: the 10 M lake's 5% append,
# 500,000 frames, in ~3 s), where a fresh Spark session takes ~10 s before the pass starts.
DRIVER_FRAMES = 1_000_000
# Rows of each batch the pass is handed: Spark's (spark.sql.execution.arrow.maxRecordsPerBatch).
BATCH_ROWS = 10_000
# The frames' columns as the pass reads them (Spark reads them in the table's types).
FRAME_COLUMNS = pa.schema([schema.FRAMES.field(name) for name in ANALYSIS_COLUMNS])
# The columns of the pass's rows besides the frames' (its header rows' values; null in frame rows),
# in the order Spark's union gives them (timeline/carried.py's `carry_on`).
HEADER_COLUMNS = pa.schema([schema.ANALYSIS_STATE.field(name) for name in STATE_COLUMNS]
                           + [(STORED, pa.bool_()), (HEADER, pa.string())])


@dataclass
class DriverCarried:
    """What the driver's carried pass gives the run (incremental.CarriedPass: Spark's)."""
    written: dict[str, list[AddAction]]   # the files of the rows to write, per table (WRITTEN_TABLES)
    raw: pa.Table                         # the connections' findings about one connection (RAW_FINDINGS)
    changed: pa.Table                     # the requeue_related delivery rows written and replaced
    fallbacks: dict[str, str]             # connection -> why it must be analysed whole
    frames: int                           # new frame rows read
    connections: int                      # connections carried on
    records: int                          # records their checkpoints held

    @property
    def rows(self) -> dict[str, int]:
        """Rows written per table (analysis_state's aside: a run reports the others)."""
        return {name: rows_in(self.written.get(name, [])) for name in WRITTEN_TABLES if name != STATE_TABLE}

    def discard(self, lake: str) -> None:
        """The files the pass wrote deleted (no log names them)."""
        for name, adds in self.written.items():
            fs, root = filesystem(f"{lake.rstrip('/')}/{name}")
            for add in adds:
                fs.delete_file(f"{root}/{add.path}")


def carry_on_in_driver(lake: str, new_files: tuple[str, ...], keys: list[str], settings: Settings,
                       frames_version: int) -> DriverCarried:
    """The carried pass over the frames of `new_files` (the connections `keys`), in this process:
    its files written into the lake's tables, uncommitted."""
    frames = new_frames(lake, new_files, frames_version)
    stored = read_table(lake, STATE_TABLE, schema.ANALYSIS_STATE, columns=["connection_id", *STATE_COLUMNS],
                        where=pc.field("connection_id").isin(keys))
    states = {row["connection_id"]: row for row in stored.to_pylist()} if stored is not None else {}
    headers = {key: json.dumps(row) for key, row in facts_in_lake(lake)(set(keys)).items()}
    rows = carried_layout(frames, states, headers)
    del frames
    partition = _CarriedPartition(settings, frames_version, FLUSH_RECORDS, lake, FILE_ROWS)
    wide = pa.Table.from_batches(list(partition.run(iter(rows.to_batches(max_chunksize=BATCH_ROWS)))), schema=WIDE)
    fallbacks = {row["connection_id"]: row["reason"] for row in rows_from_wide(wide, "fallback").to_pylist()}
    written = add_actions(rows_from_wide(wide, "files", FILES).to_pylist())
    tally = rows_from_wide(wide, "tally")
    stale = wide.filter(pc.and_(pc.equal(wide[RECORD], "deliveries"), pc.equal(wide[ROLE], STALE)))
    return DriverCarried({name: written.get(name, []) for name in WRITTEN_TABLES},
                         rows_from_wide(wide, "raw_findings", RAW_FINDINGS),
                         changed_in_driver(lake, rows_from_wide(stale, "deliveries", TIMELINE_TABLES["deliveries"]),
                                           written.get("deliveries", [])),
                         fallbacks, frames=pc.sum(tally["frames"]).as_py() or 0,
                         connections=len(keys) - len(fallbacks), records=pc.sum(tally["carried_records"]).as_py() or 0)


def new_frames(lake: str, new_files: tuple[str, ...], frames_version: int) -> pa.Table:
    """The rows of these files of `frames` at `frames_version` (as the run's plan names them), in FRAME_COLUMNS."""
    base = spark_location(os.path.join(lake, "frames"))
    return read_table(lake, "frames", FRAME_COLUMNS, files={relative_in_table(uri, base) for uri in new_files},
                      version=frames_version)


def carried_layout(frames: pa.Table, states: dict[str, dict], headers: dict[str, str]) -> pa.Table:
    """The carried pass's input as `carry_on` lays it out for `mapInArrow`: for each connection of
    `frames` (its new frame rows, FRAME_COLUMNS), a header row (its connections row as the pass's
    header JSON, `headers`, and its analysis_state row's STATE_COLUMNS, `states`, if stored), then
    its frames, by connection and seq."""
    for field in HEADER_COLUMNS:
        frames = frames.append_column(field, pa.nulls(frames.num_rows, field.type))
    header_rows = [{"connection_id": c, "seq": HEADER_SEQ, HEADER: headers.get(c), STORED: c in states,
                    **{name: states.get(c, {}).get(name) for name in STATE_COLUMNS}}
                   for c in sorted(set(frames["connection_id"].to_pylist()))]
    rows = pa.Table.from_pylist(header_rows, schema=frames.schema)
    return pa.concat_tables([rows, frames]).sort_by([("connection_id", "ascending"), ("seq", "ascending")])
