"""The deliveries a requeue touches (analyzer.detectors.messages.candidates), kept in files of their
own, so that the message kinds read only those (docs/analysis.md, "One implementation of the rules",
2). A file merged by another writer (OPTIMIZE) keeps correct statistics, and one without any is read.
"""

from __future__ import annotations

import pyarrow as pa

from analyzer.detectors.messages import candidates

REQUEUE_RELATED = "requeue_related"


def stored_schema(deliveries: pa.Schema) -> pa.Schema:
    """The deliveries table as stored: `requeue_related` after `provisional` (provisional.stored_schema says why)."""
    return deliveries.insert(deliveries.get_field_index("provisional") + 1, pa.field(REQUEUE_RELATED, pa.bool_()))


def with_flags(deliveries: pa.Table) -> pa.Table:
    """Delivery rows with `requeue_related`, where stored_schema puts it."""
    where = deliveries.schema.get_field_index("provisional") + 1
    return deliveries.add_column(where, pa.field(REQUEUE_RELATED, pa.bool_()), candidates(deliveries))
