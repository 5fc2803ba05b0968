"""A new_data run's connections, carried on from their checkpoints (timeline/carried.py): only
their new frames are read. What they write, and which stored rows that replaces:

- deliveries, publishes: rows of the same (connection, seq). That is the last run's provisional
  rows (items then open, now settled or still open) and, so that a run cut short and done again
  never writes a row twice, the rows written themselves.
- channels: the same incarnation's row; violations: every row of an incarnation whose facts are
  written (the state machine emits an incarnation's violations with its facts, when it ends or
  when the data does).
- channel_metrics: the buckets of the touched incarnations from the boundary bucket on (the
  bucket of the connection's last frame analysed before), recomputed from the records the
  checkpoint kept for them plus the run's own. The buckets before are final: carry.py sends a
  connection whose new frames would change one to the whole-connection path.
- analysis_state: the connection's checkpoint (its timeline and its detectors' state).

The pass writes every row to write as files itself (uncommitted, as the pass over whole
connections does: `written`, committed by the caller with the rows they replace deleted); what it
says of them and of the rows they replace are Spark rows of its wide table.

Their findings about one connection come out of the same pass (`raw_findings`), from the
detectors resumed from the checkpoint: nothing of the connection's history is read again.

Connections that cannot be carried exactly (`fallbacks`, with the reason) are left to the caller's
whole-connection path.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, Settings
from analyzer.detectors.messages import COLUMNS
from analyzer.lake import TableWriter

from .delta_io import Listed, Match, connections_match, read_delta, read_files
from .connection_pass import RAW_FINDINGS, STATE_TABLE, WRITTEN_TABLES
from .requeue_related import REQUEUE_RELATED
from .table_files import adds_that_may_hold, rows_in
from .timeline.carried import STALE, carried_rows, carry_on, without_fallbacks
from .timeline.plans import measured, of_connections
from .timeline.wide import RECORD, ROLE, column, rows_from_wide
from .timeline.tables import TIMELINE_TABLES
from .wide_writes import add_actions, read_written

INCARNATION = ["connection_id", "channel", "incarnation"]


@dataclass
class CarriedPass:
    """What the carried pass gives the run, for all its carried connections (what carrying one
    connection on gives: analyzer.connection_analysis.Carried)."""
    written: dict[str, list[AddAction]]   # the files of the rows to write, per table, written by the pass
    rows: dict[str, int]                  # rows to write, per table
    matches: dict[str, list[Match | Listed]]   # the stored rows they replace
    fallbacks: dict[str, str]             # connection -> why it must be analysed whole
    frames: int                           # new frame rows read for the carried connections
    connections: int                      # connections carried
    records: int                          # records their checkpoints held
    wide: DataFrame                       # the pass's wide table, materialised (timeline/carried.py)

    @property
    def whole_keys(self) -> list[str]:
        return sorted(self.fallbacks)

    def in_driver(self, lake: str) -> tuple[pa.Table, pa.Table]:
        """What the findings step (findings.py) takes of the pass, in Arrow: its findings about one
        connection (connection_pass.RAW_FINDINGS) and the requeue_related delivery rows it wrote
        and replaced (their message kinds' COLUMNS: what it changed of what those kinds read), the
        wide table's rows of both in one Spark job, the written files' read by the driver."""
        stale = (F.col(RECORD) == "deliveries") & (F.col(ROLE) == STALE) & column("deliveries", REQUEUE_RELATED)
        rows = self.wide.where((F.col(RECORD) == "raw_findings") | stale).select(
            RECORD, "raw_findings", "deliveries").toArrow()
        return (rows_from_wide(rows, "raw_findings", RAW_FINDINGS),
                changed_in_driver(lake, rows_from_wide(rows, "deliveries", TIMELINE_TABLES["deliveries"]),
                                  self.written.get("deliveries", [])))


def changed_in_driver(lake: str, stale: pa.Table, written: list[AddAction]) -> pa.Table:
    """What a carried run changes of what the message kinds read, in their COLUMNS: the requeue_related rows of `stale` (delivery rows replaced) and
    of the deliveries' files the pass wrote (`written`), read from those that may hold one."""
    deliveries = TIMELINE_TABLES["deliveries"]
    writer = TableWriter(lake, "deliveries", deliveries)
    parts = [stale, *[writer.read_file(add.path, add.partition_values["date"])
              for add in adds_that_may_hold(written, REQUEUE_RELATED)]]
    return pa.concat_tables([part.filter(pc.fill_null(part[REQUEUE_RELATED], False)).select(COLUMNS)
                             for part in parts])


def carry_on_connections(spark: SparkSession, lake: str, new_files: tuple[str, ...], keys: list[str], mode: str,
                         connections: DataFrame, settings: Settings, frames_version: int,
                         leave: tuple[str, ...] = ()) -> CarriedPass:
    """`keys`: the connections of the new files to carry on; `leave`: those of theirs not to (the
    run analyses them whole: run_scope.RunScope.whole), whose frames and checkpoints are not read."""
    new = read_files(spark, lake, "frames", new_files, list(ANALYSIS_COLUMNS))
    if leave:
        new = of_connections(new, keys)
    states = of_connections(read_delta(spark, lake, STATE_TABLE, schema.ANALYSIS_STATE, mode), keys)
    # What the wide table holds, taken while it is materialised: the fallbacks and the files the
    # pass wrote (few), and the carried connections' tallies summed.
    def measured_carry(wide: DataFrame) -> tuple[DataFrame, dict]:
        return measured(
            wide, fallbacks=F.collect_list("fallback"), files=F.collect_list("files"),
            **{c: F.coalesce(F.sum(column("tally", c)), F.lit(0)) for c in ("frames", "carried_records")})

    wide, seen = measured_carry(carry_on(new, states, of_connections(connections, keys), settings, frames_version,
                                         write_to=lake))
    fallbacks = {row["connection_id"]: row["reason"] for row in seen["fallbacks"]}
    streamed = sorted(row["connection_id"] for row in seen["fallbacks"] if row["streamed"])
    if streamed:
        # Rows of connections that fell back after some of theirs had left the pass: dropped (the
        # pass took those it wrote back out of its files), the rest counted again.
        wide, seen = measured_carry(without_fallbacks(wide, streamed))
    written = add_actions(seen["files"])
    rows = {name: rows_in(written.get(name, [])) for name in WRITTEN_TABLES}

    def written_rows(name: str, columns: list[str] | None = None) -> DataFrame:
        return read_written(spark, lake, name, written.get(name, []), TIMELINE_TABLES[name], columns)

    read = {c: seen[c] for c in ("frames", "carried_records")}
    carried_keys = [k for k in keys if k not in fallbacks]
    return CarriedPass({name: written.get(name, []) for name in WRITTEN_TABLES}, rows,
                       _matches(wide, written_rows, carried_keys), fallbacks,
                       frames=read["frames"], connections=len(keys) - len(fallbacks),
                       records=read["carried_records"], wide=wide)


def _matches(wide: DataFrame, written_rows, carried_keys: list[str]) -> dict[str, list[Match | Listed]]:
    """The stored rows each table's new rows replace. `written_rows(name, columns)`: those columns
    of the rows the pass wrote to files."""
    def keys(name: str, columns: list[str]) -> DataFrame:
        return written_rows(name, columns).unionByName(carried_rows(wide, name, STALE).select(*columns))

    items = ["connection_id", "seq"]
    incarnations = keys("channels", INCARNATION)
    return {
        "deliveries": [Match(keys("deliveries", items), tuple(items))],
        "publishes": [Match(keys("publishes", items), tuple(items))],
        "channels": [Match(incarnations, tuple(INCARNATION))],
        "violations": [Match(incarnations, tuple(INCARNATION))],
        "channel_metrics": [Match(carried_rows(wide, "touched"), tuple(INCARNATION), ("bucket_start_ns", "from_ns"))],
        STATE_TABLE: [connections_match(carried_keys)],
    }
