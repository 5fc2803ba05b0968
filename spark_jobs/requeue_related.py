"""The deliveries a requeue touches, kept in files of their own, so that the message kinds read only
those (docs/analysis.md, "One implementation of the rules", 2).

requeue_loop and redelivery_after_close read, of the whole deliveries table, only what
analyzer.detectors.messages.candidates picks (1.6% of the rows on bench/jobs.py's 10 M-frame lake).
Every write of the deliveries stores `requeue_related`, true for exactly those rows, in files apart
(analyzer.lake.TableWriter's `split_by`), so the Delta log's statistics of it name the files to read;
a file merged by another writer (OPTIMIZE) keeps correct statistics, and one without any is read.
"""

from __future__ import annotations

import pyarrow as pa

from analyzer.detectors.messages import candidates

REQUEUE_RELATED = "requeue_related"


def stored_schema(deliveries: pa.Schema) -> pa.Schema:
    """The deliveries table as stored (after provisional.stored_schema): `requeue_related` after
    `provisional`, among the first 32 columns, whose statistics Delta writers keep."""
    return deliveries.insert(deliveries.get_field_index("provisional") + 1, pa.field(REQUEUE_RELATED, pa.bool_()))


def with_flags(deliveries: pa.Table) -> pa.Table:
    """Delivery rows (their columns as records.Delivery's) with `requeue_related`, where
    stored_schema puts it."""
    where = deliveries.schema.get_field_index("provisional") + 1
    return deliveries.add_column(where, pa.field(REQUEUE_RELATED, pa.bool_()), candidates(deliveries))
