"""The per-connection tables as stored, by name: the four timeline tables and channel_metrics,
each with the `provisional` column (provisional.py), what both paths produce, column for column."""

from analyzer import schema
from analyzer.timeline import CHANNELS, VIOLATIONS

from ..provisional import stored_schema

TIMELINE_TABLES = {
    "deliveries": stored_schema(schema.DELIVERIES),
    "publishes": stored_schema(schema.PUBLISHES),
    "channels": stored_schema(CHANNELS),
    "violations": stored_schema(VIOLATIONS),
}
CHANNEL_METRICS = stored_schema(schema.CHANNEL_METRICS)
