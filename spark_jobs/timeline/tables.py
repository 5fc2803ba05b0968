"""The four timeline tables, by name: what both paths produce, column for column."""

from analyzer import schema
from analyzer.timeline import CHANNELS, VIOLATIONS

TIMELINE_TABLES = {
    "deliveries": schema.DELIVERIES,
    "publishes": schema.PUBLISHES,
    "channels": CHANNELS,
    "violations": VIOLATIONS,
}
