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
says of them and of the rows they replace are rows of its wide table, whichever executor ran it:
Spark collects them in one job (they are few: files, the rows replaced, tallies, findings), the
local executor has them in Arrow, and both make the run's facts of them with `carried_summary`.

Their findings about one connection come out of the same pass (`raw_findings`), from the
detectors resumed from the checkpoint: nothing of the connection's history is read again.

Connections that cannot be carried exactly (`fallbacks`, with the reason) are left to the caller's
whole-connection path.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from analyzer.detectors.messages import COLUMNS
from analyzer.lake import READ_CHECKSUMS, TableWriter, filesystem

from .delta_io import Listed, Match, connections_match
from .connection_pass import RAW_FINDINGS, STATE_TABLE, WRITTEN_TABLES
from .requeue_related import REQUEUE_RELATED
from .table_files import adds_that_may_hold, rows_in
from .timeline.carried import STALE, TALLY, TOUCHED, without_fallbacks
from .timeline.wide import ROLE, rows_from_wide
from .timeline.tables import TIMELINE_TABLES
from .wide_writes import FILES, add_actions

INCARNATION = ["connection_id", "channel", "incarnation"]
# The stored rows a carried run's rows of each timeline table replace: those equal on these
# columns to the rows it writes, and replaces, of this table (violations: every row of an
# incarnation whose channels row is written).
REPLACED_BY = {"deliveries": ("deliveries", ["connection_id", "seq"]),
               "publishes": ("publishes", ["connection_id", "seq"]),
               "channels": ("channels", INCARNATION), "violations": ("channels", INCARNATION)}


@dataclass
class CarriedPass:
    """What the carried pass gives the run, for all its carried connections (what carrying one
    connection on gives: analyzer.connection_analysis.Carried), from its wide table's rows in
    Arrow (`carried_summary`), whichever executor ran it."""
    written: dict[str, list[AddAction]]   # the files of the rows to write, per table, written by the pass
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
        if name == "channel_metrics":
            return [Match(self.touched, tuple(INCARNATION), ("bucket_start_ns", "from_ns"))]
        if name == STATE_TABLE:
            return [connections_match(self.carried_keys)]
        table, columns = REPLACED_BY[name]
        keys = pa.schema([TIMELINE_TABLES[table].field(column) for column in columns])
        stale = rows_from_wide(self.stale, table, keys)
        return [Match(pa.concat_tables([written_columns(lake, table, self.written.get(table, []), keys), stale]),
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
    """The carried pass's wide table's rows (timeline/carried.WIDE: Spark's collected, or the local
    executor's) over the connections `keys`, as the run reads them. The rows of a connection that
    fell back after some of its rows had left the pass (`streamed`: the pass took those it wrote
    back out of its files) are dropped."""
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


def written_columns(lake: str, name: str, adds: list[AddAction], columns: pa.Schema) -> pa.Table:
    """These data columns of the rows of table `name` in files written and not committed yet."""
    fs, root = filesystem(f"{lake.rstrip('/')}/{name}")
    return pa.concat_tables([columns.empty_table(), *[
        pq.read_table(f"{root}/{add.path}", columns=columns.names, filesystem=fs, partitioning=None,
                      **READ_CHECKSUMS).cast(columns) for add in adds]])
