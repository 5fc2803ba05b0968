"""Rows a later run may replace, kept in files of their own, so that a carried run rewrites only
those (docs/analysis.md, "Incremental": Only the provisional rows' files are rewritten).

`provisional` is true on what a run wrote for what was still open (deliveries, publishes and channel
incarnations, and those incarnations' channel_metrics buckets from the boundary on; carry.py says
why nothing else can change): the rows a carried run replaces are exactly its connections'
provisional rows, all of which it writes again, so it needs no key join.
"""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable

from analyzer.published import RUN_ID_KEY
from analyzer.timeline.records import ChannelFacts

PROVISIONAL = "provisional"


def stored_schema(table_schema: pa.Schema) -> pa.Schema:
    """A per-connection table as stored: `provisional` after the partition column, as Delta writers
    keep per-file statistics of the first 32 columns only (`delta.dataSkippingNumIndexedCols`)."""
    return table_schema.insert(1, pa.field(PROVISIONAL, pa.bool_()))


def flagged(table: pa.Table, provisional: bool | pa.Array) -> pa.Table:
    """`table` with the `provisional` column where stored_schema puts it: one value or one per row."""
    if isinstance(provisional, bool):
        provisional = pa.array([provisional] * table.num_rows, pa.bool_())
    return table.add_column(1, pa.field(PROVISIONAL, pa.bool_()), provisional)


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
    """`provisional` of channel_metrics rows (dicts); `open_from`: `open_buckets` of each connection
    with a checkpoint (the others' rows are all final)."""
    flags = []
    for row in rows:
        where = open_from.get(row["connection_id"])
        flags.append(where is not None and row["bucket_start_ns"] >= where[0]
                     and (row["channel"], row["incarnation"]) in where[1])
    return pa.array(flags, pa.bool_())
