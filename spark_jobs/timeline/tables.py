"""The per-connection tables as stored, with `provisional` (and the deliveries with `requeue_related`):
what both paths produce, column for column."""

import pyarrow as pa

from analyzer import schema
from analyzer.timeline import CHANNELS, VIOLATIONS

from .. import requeue_related
from ..provisional import flagged, stored_schema

TIMELINE_TABLES = {
    "deliveries": requeue_related.stored_schema(stored_schema(schema.DELIVERIES)),
    "publishes": stored_schema(schema.PUBLISHES),
    "channels": stored_schema(CHANNELS),
    "violations": stored_schema(VIOLATIONS),
}
CHANNEL_METRICS = stored_schema(schema.CHANNEL_METRICS)


def as_stored(name: str, rows: pa.Table, provisional: bool) -> pa.Table:
    """A timeline table's rows with the columns it is stored with, every row `provisional` or none."""
    rows = flagged(rows, provisional)
    return requeue_related.with_flags(rows) if name == "deliveries" else rows
