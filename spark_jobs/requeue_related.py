"""The deliveries a requeue touches, kept in files of their own, so that the message kinds read only those.

requeue_loop and redelivery_after_close (cross_connection_findings.py) read, of the whole
deliveries table, only what analyzer.detectors.messages.candidates picks: deliveries of a known
message bounced by nack or reject, delivered again (redelivered, or dead-lettered before), or left
unacked at a close (which requeues them). They are a few in a hundred (1.6% on bench/jobs.py's 10 M-frame lake), yet finding
them cost every run a scan of every column of every delivery, however few rows the run changed.

So every write of the deliveries table stores `requeue_related`, true for exactly those rows, and
puts true and false rows in files apart (analyzer.lake.TableWriter's `split_by`, as `provisional`).
The Delta log keeps each file's min and max of the column, and the kinds read only its true rows
of the files whose `requeue_related` may be true (`delta_io.read_delta`'s `files_where`), picking
theirs among them with `candidates` as before. A file merged by another writer (OPTIMIZE) keeps
correct statistics and is read; one without statistics is read too.
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
