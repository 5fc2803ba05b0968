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

The pass writes every row to write as files itself (uncommitted, as a full run's pass writes its
timeline tables: `written`, committed by the caller with the rows they replace deleted); what it
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
from .connection_pass import RAW_FINDINGS, STATE_TABLE
from .requeue_related import REQUEUE_RELATED
from .table_files import adds_that_may_hold, rows_in
from .timeline.carried import (CARRIED_TABLES, ROLES, STALE, WRITTEN_TABLES, carried_rows, carry_on,
                               without_fallbacks)
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
    requeue_changed: DataFrame            # the requeue_related delivery rows written and replaced
    requeue_changed_rows: int             # how many, at most (a written file's rows count whole): 0 is exact
    rows: dict[str, int]                  # rows to write, per table
    matches: dict[str, list[Match | Listed]]   # the stored rows they replace
    fallbacks: dict[str, str]             # connection -> why it must be analysed whole
    frames: int                           # new frame rows read for the carried connections
    connections: int                      # connections carried
    records: int                          # records their checkpoints held
    raw_findings: DataFrame               # their findings about one connection (connection_pass.RAW_FINDINGS)
    raw_rows: int                         # how many
    wide: DataFrame                       # the pass's wide table, materialised (timeline/carried.py)

    @property
    def whole_keys(self) -> list[str]:
        return sorted(self.fallbacks)

    def in_driver(self, lake: str) -> tuple[pa.Table, pa.Table]:
        """`raw_findings` and `requeue_changed` (its message kinds' COLUMNS) in Arrow, for the
        driver: the wide table's rows of both in one Spark job, the written files' by the driver."""
        stale = (F.col(RECORD) == "deliveries") & (F.col(ROLE) == STALE) & column("deliveries", REQUEUE_RELATED)
        rows = self.wide.where((F.col(RECORD) == "raw_findings") | stale).select(
            RECORD, "raw_findings", "deliveries").toArrow()
        return (rows_from_wide(rows, "raw_findings", RAW_FINDINGS),
                changed_in_driver(lake, rows_from_wide(rows, "deliveries", TIMELINE_TABLES["deliveries"]),
                                  self.written.get("deliveries", [])))


def changed_in_driver(lake: str, stale: pa.Table, written: list[AddAction]) -> pa.Table:
    """What a carried run changes of what the message kinds read (`_requeue_changed`), in the
    driver and in their COLUMNS: the requeue_related rows of `stale` (delivery rows replaced) and
    of the deliveries' files the pass wrote (`written`), read from those that may hold one."""
    deliveries = TIMELINE_TABLES["deliveries"]
    writer = TableWriter(lake, "deliveries", deliveries)
    parts = [stale, *[writer.read_file(add.path, add.partition_values["date"])
              for add in adds_that_may_hold(written, REQUEUE_RELATED)]]
    return pa.concat_tables([part.filter(pc.fill_null(part[REQUEUE_RELATED], False)).select(COLUMNS)
                             for part in parts])


def carry_on_connections(spark: SparkSession, lake: str, new_files: tuple[str, ...], keys: list[str], mode: str,
                         connections: DataFrame, settings: Settings, frames_version: int) -> CarriedPass:
    new = read_files(spark, lake, "frames", new_files, list(ANALYSIS_COLUMNS))
    states = of_connections(read_delta(spark, lake, STATE_TABLE, schema.ANALYSIS_STATE, mode), keys)
    # What the wide table holds, taken while it is materialised: its rows by record and role, the
    # fallbacks and the files the pass wrote (few), and the carried connections' tallies summed.
    roles = [(name, role) for name in CARRIED_TABLES for role in ROLES.get(name, (None,))]

    def measured_carry(wide: DataFrame) -> tuple[DataFrame, dict]:
        return measured(
            wide, **{f"n{i}": F.count(F.when((F.col(RECORD) == name) & _role_is(role), True))
                     for i, (name, role) in enumerate(roles)},
            stale_requeue_related=F.count(F.when((F.col(RECORD) == "deliveries") & _role_is(STALE)
                                                 & column("deliveries", REQUEUE_RELATED), True)),
            fallbacks=F.collect_list("fallback"), files=F.collect_list("files"),
            **{c: F.coalesce(F.sum(column("tally", c)), F.lit(0)) for c in ("frames", "carried_records")})

    wide, seen = measured_carry(carry_on(new, states, of_connections(connections, keys), settings, frames_version,
                                         write_to=lake))
    fallbacks = {row["connection_id"]: row["reason"] for row in seen["fallbacks"]}
    streamed = sorted(row["connection_id"] for row in seen["fallbacks"] if row["streamed"])
    if streamed:
        # Rows of connections that fell back after some of theirs had left the pass: dropped (the
        # pass took those it wrote back out of its files), the rest counted again.
        wide, seen = measured_carry(without_fallbacks(wide, streamed))
    counts = {key: seen[f"n{i}"] for i, key in enumerate(roles)}
    written = add_actions(seen["files"])
    rows = {name: rows_in(written.get(name, [])) for name in WRITTEN_TABLES}

    def written_rows(name: str, columns: list[str] | None = None) -> DataFrame:
        return read_written(spark, lake, name, written.get(name, []), TIMELINE_TABLES[name], columns)

    read = {c: seen[c] for c in ("frames", "carried_records")}
    carried_keys = [k for k in keys if k not in fallbacks]
    requeue_changed, requeue_changed_rows = _requeue_changed(wide, spark, lake, written.get("deliveries", []),
                                                             seen["stale_requeue_related"])
    return CarriedPass({name: written.get(name, []) for name in WRITTEN_TABLES}, requeue_changed,
                       requeue_changed_rows, rows, _matches(wide, written_rows, carried_keys, counts, rows), fallbacks,
                       frames=read["frames"], connections=len(keys) - len(fallbacks),
                       records=read["carried_records"], raw_findings=carried_rows(wide, "raw_findings"),
                       raw_rows=counts.get(("raw_findings", None), 0), wide=wide)


def _requeue_changed(wide: DataFrame, spark: SparkSession, lake: str, adds: list[AddAction],
                     stale_rows: int) -> tuple[DataFrame, int]:
    """The requeue_related delivery rows the pass wrote (read from only the files that may hold
    one: the writers keep them in files apart, so those hold nothing else) and those the rows it
    wrote replace (`stale`, `stale_rows` of them): all a carried run changes of what the message
    kinds read (detectors/scoped.py); and how many, at most: every row of a file that may hold one."""
    flagged = adds_that_may_hold(adds, REQUEUE_RELATED)
    # The replaced rows are few and spread over every partition of the wide table: one task
    # gathers them, where each partition would be a task of every job that reads them.
    stale = carried_rows(wide, "deliveries", STALE).where(F.col(REQUEUE_RELATED)).coalesce(1)
    rows = read_written(spark, lake, "deliveries", flagged, TIMELINE_TABLES["deliveries"]).where(
        F.col(REQUEUE_RELATED)).unionByName(stale)
    return rows, rows_in(flagged) + stale_rows


def _role_is(role: str | None):
    return F.col(ROLE).isNull() if role is None else F.col(ROLE) == role


def _matches(wide: DataFrame, written_rows, carried_keys: list[str], counts: dict,
             rows: dict[str, int]) -> dict[str, list[Match | Listed]]:
    """The stored rows each table's new rows replace; the key sets' sizes are known from `counts`
    (rows of the wide table by record and role) and `rows` (of the files written), so none is
    counted again. `written_rows(name, columns)`: those columns of the rows the pass wrote to files."""
    def written_or_stale(name: str) -> int:
        return rows[name] + counts.get((name, STALE), 0)

    def keys(name: str, columns: list[str]) -> DataFrame:
        return written_rows(name, columns).unionByName(carried_rows(wide, name, STALE).select(*columns))

    items = ["connection_id", "seq"]
    incarnations = keys("channels", INCARNATION)
    return {
        "deliveries": [Match(keys("deliveries", items), tuple(items), rows=written_or_stale("deliveries"))],
        "publishes": [Match(keys("publishes", items), tuple(items), rows=written_or_stale("publishes"))],
        "channels": [Match(incarnations, tuple(INCARNATION), rows=written_or_stale("channels"))],
        "violations": [Match(incarnations, tuple(INCARNATION), rows=written_or_stale("channels"))],
        "channel_metrics": [Match(carried_rows(wide, "touched"), tuple(INCARNATION), ("bucket_start_ns", "from_ns"),
                                  rows=counts.get(("touched", None), 0))],
        STATE_TABLE: [connections_match(wide.sparkSession, carried_keys)],
    }
