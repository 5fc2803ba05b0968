"""What a carried pass adds to the one pass (connection_pass.py; docs/analysis.md, "Incremental",
Carried connections): each connection's stored state in its header row, resumed or refused, and
what its rows replace of the stored ones, whichever executor ran it.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analyzer.detectors.messages import COLUMNS
from analyzer.lake import READ_CHECKSUMS, TableWriter, filesystem
from analyzer.timeline.carry import FORMAT, Checkpoint, StateError, load

from .delta_io import Listed, Match, connections_match
from .requeue_related import REQUEUE_RELATED
from .table_files import adds_that_may_hold
from .timeline.tables import TIMELINE_TABLES
from .timeline.wide import rows_from_wide

STALE = "stale"
# A connection new to the run has no stored metrics: its incarnations' buckets are all computed here.
FIRST_BUCKET = -(2**63)
TOUCHED = pa.schema([("connection_id", pa.string()), ("channel", pa.int32()), ("incarnation", pa.int32()),
                     ("from_ns", pa.int64())])
FALLBACK = pa.schema([("connection_id", pa.string()), ("reason", pa.string())])
# The header row's column saying the connection has an analysis_state row (it may have only a connections row).
STORED = "_stored"
# The header row's columns of the connection's analysis_state row.
STATE_COLUMNS = ("format", "checkpoint", "carried_records")
INCARNATION = ["connection_id", "channel", "incarnation"]
# The stored rows a carried run's rows of each timeline table replace: those equal on these
# columns to the rows it writes, and replaces, of this table. Of deliveries and publishes, those
# are the last run's provisional rows and, so that a run redone never writes a row twice, the rows
# written themselves. Violations: every row of an incarnation whose channels row is written (the
# machine emits an incarnation's violations with its facts).
REPLACED_BY = {"deliveries": ("deliveries", ["connection_id", "seq"]),
               "publishes": ("publishes", ["connection_id", "seq"]),
               "channels": ("channels", INCARNATION), "violations": ("channels", INCARNATION)}


def resumed(header: dict) -> tuple[Checkpoint | None, str | None]:
    """A header row's checkpoint (None: a connection new to the run), or why it is refused."""
    if not header.get(STORED):
        return None, None
    if header["checkpoint"] is None:
        return None, "no checkpoint: it had ended (closed or FIN/RST) or its frame times went back"
    if header["format"] != FORMAT:
        return None, f"checkpoint format {header['format']}, not {FORMAT}"
    try:
        return load(header["checkpoint"]), None
    except StateError as error:
        return None, f"checkpoint refused: {error}"


def replaced(carried, lake: str, name: str) -> list[Match | Listed]:
    """The stored rows of table `name` a carried pass's (connection_pass.PassSummary) written rows
    replace, their keys in Arrow: the keys of the rows it wrote (read from its files by the driver)
    and of the stale rows."""
    if name == "channel_metrics":   # the touched incarnations' buckets from the carried one on
        return [Match(carried.touched, tuple(INCARNATION), ("bucket_start_ns", "from_ns"))]
    if name not in REPLACED_BY:     # analysis_state: the carried connections' rows
        return [connections_match(carried.tally["connection_id"].to_pylist())]
    table, columns = REPLACED_BY[name]
    keys = pa.schema([TIMELINE_TABLES[table].field(column) for column in columns])
    fs, root = filesystem(f"{lake.rstrip('/')}/{table}")
    written = [pq.read_table(f"{root}/{add.path}", columns=keys.names, filesystem=fs, partitioning=None,
                             **READ_CHECKSUMS).cast(keys) for add in carried.written.get(table, [])]
    return [Match(pa.concat_tables([keys.empty_table(), *written, rows_from_wide(carried.stale, table, keys)]),
                  tuple(columns))]


def changed(carried, lake: str) -> pa.Table:
    """What a carried pass changes of what the message kinds read, in their COLUMNS: the
    requeue_related delivery rows it replaced (stale) and wrote (read from the files that may hold one)."""
    deliveries = TIMELINE_TABLES["deliveries"]
    writer = TableWriter(lake, "deliveries", deliveries)
    parts = [rows_from_wide(carried.stale, "deliveries", deliveries),
             *[writer.read_file(add.path, add.partition_values["date"])
               for add in adds_that_may_hold(carried.written.get("deliveries", []), REQUEUE_RELATED)]]
    return pa.concat_tables([part.filter(pc.fill_null(part[REQUEUE_RELATED], False)).select(COLUMNS)
                             for part in parts])
