"""Rows a later run may replace, kept in files of their own, so that a carried run rewrites only those.

A connection carried on from its checkpoint (carried_pass.py) replaces, in the per-connection tables,
only what the last run wrote for what was then still open: its open deliveries and publishes, the
facts and violations of its open channel incarnations, and their channel_metrics buckets from the
boundary bucket on (analyzer/timeline/carry.py says why nothing else can change). Every run writes
those rows with `provisional` = true (a column of the stored tables: "the next run may replace
this row"), and a table write puts them in files apart from the final rows (delta_io: Spark's write
is split by the flag). The Delta log keeps each file's min and max of the column, so the files that
can hold a replaced row are known from the log alone, without reading the table: those whose
`provisional` may be true (or whose statistics are missing, as after a writer that keeps none). A
carried run reads and rewrites just those, however large the table. And it needs no key join to
find the rows it replaces: those are exactly the carried connections' provisional rows. Every
provisional row of a connection comes from its checkpoint's open records, which the carried run
writes again (as `stale` keys, their incarnations' facts and violations, and those incarnations'
buckets from the boundary on), and no final row is ever replaced.

One more kind of row gets replaced: a run cut short after some of its commits and done again
writes the same rows again, and must first delete what the cut-short run wrote, provisional or
not. Every commit of a run carries its run id (`userMetadata`, as delta-spark writes it), and
analysis_runs lists the runs that finished; a table whose latest commit is not a finished run's
(a run cut short, or another writer) is searched whole, as before this scheme.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from analyzer.published import RUN_ID_KEY
from analyzer.timeline.records import ChannelFacts

from .table_files import files_that_may_hold

PROVISIONAL = "provisional"


def stored_schema(table_schema: pa.Schema) -> pa.Schema:
    """A per-connection table as stored: `provisional` after the partition column, then its columns.
    Near the front because Delta writers keep per-file statistics of the first 32 columns only
    (`delta.dataSkippingNumIndexedCols`): delta-rs, delta-spark and their OPTIMIZE all keep these."""
    return table_schema.insert(1, pa.field(PROVISIONAL, pa.bool_()))


def flagged(table: pa.Table, provisional: bool | pa.Array) -> pa.Table:
    """`table` with the `provisional` column (where stored_schema puts it): one value for every
    row, or one per row."""
    if isinstance(provisional, bool):
        provisional = pa.array([provisional] * table.num_rows, pa.bool_())
    return table.add_column(1, pa.field(PROVISIONAL, pa.bool_()), provisional)


def files_with_provisional_rows(table: DeltaTable) -> set[str]:
    """The files of the table's snapshot that may hold a provisional row (table_files.files_that_may_hold)."""
    return files_that_may_hold(table, PROVISIONAL)


def last_written_by_finished_run(table: DeltaTable, finished_runs: set[str]) -> bool:
    """Is the table's latest commit one of these runs'?"""
    history = table.history(1)
    return bool(history) and history[0].get(RUN_ID_KEY) in finished_runs


def open_buckets(checkpoint) -> tuple[int, frozenset]:
    """What of a connection's channel_metrics the next run may replace (carry.Checkpoint): the
    buckets from `boundary_ns` on of the incarnations still open."""
    live = frozenset((x.channel, x.incarnation) for x in checkpoint.provisional if isinstance(x, ChannelFacts))
    return checkpoint.boundary_ns, live


def metric_flags(rows: list[dict], open_from: dict[str, tuple[int, frozenset]]) -> pa.Array:
    """`provisional` of channel_metrics rows (analyzer/timeline/metrics.py dicts); `open_from`:
    `open_buckets` of each connection with a checkpoint (the others' rows are all final)."""
    flags = []
    for row in rows:
        where = open_from.get(row["connection_id"])
        flags.append(where is not None and row["bucket_start_ns"] >= where[0]
                     and (row["channel"], row["incarnation"]) in where[1])
    return pa.array(flags, pa.bool_())
