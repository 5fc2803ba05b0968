"""What the carried pass (timeline/carried.py) gives a run, from its wide table, whichever executor
ran it: the files it wrote, uncommitted, the stored rows they replace, its findings about one
connection, and the connections to analyse whole instead (docs/analysis.md, "Incremental").
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
# columns to the rows it writes, and replaces, of this table. Of deliveries and publishes, those
# are the last run's provisional rows and, so that a run redone never writes a row twice, the rows
# written themselves. Violations: every row of an incarnation whose channels row is written (the
# machine emits an incarnation's violations with its facts).
REPLACED_BY = {"deliveries": ("deliveries", ["connection_id", "seq"]),
               "publishes": ("publishes", ["connection_id", "seq"]),
               "channels": ("channels", INCARNATION), "violations": ("channels", INCARNATION)}


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


def written_columns(lake: str, name: str, adds: list[AddAction], columns: pa.Schema) -> pa.Table:
    """These data columns of the rows of table `name` in files written and not committed yet."""
    fs, root = filesystem(f"{lake.rstrip('/')}/{name}")
    return pa.concat_tables([columns.empty_table(), *[
        pq.read_table(f"{root}/{add.path}", columns=columns.names, filesystem=fs, partitioning=None,
                      **READ_CHECKSUMS).cast(columns) for add in adds]])
