"""The deliveries a requeue touches, kept in files of their own, so that the message kinds read only those.

requeue_loop and redelivery_after_close (detectors/messages.py) read, of the whole deliveries
table, only what `messages.candidate()` picks: deliveries of a known message bounced by nack or
reject, delivered again (redelivered, or dead-lettered before), or left unacked at a close (which
requeues them). They are a few in a hundred (1.6% on bench/jobs.py's 10 M-frame lake), yet finding
them cost every run a scan of every column of every delivery, however few rows the run changed.

So every write of the deliveries table stores `requeue_related`, true for exactly those rows, and
puts true and false rows in files apart (analyzer.lake.TableWriter's `split_by`, as `provisional`).
The Delta log keeps each file's min and max of the column, and the kinds read only its true rows
of the files whose `requeue_related` may be true (`delta_io.read_delta`'s `files_where`), picking
theirs among them with `candidate()` as before. A file merged by another writer (OPTIMIZE) keeps
correct statistics and is read; one without statistics is read too.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from analyzer.detectors.messages import BOUNCED_BY, CLOSED

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


def candidates(deliveries: pa.Table) -> pa.ChunkedArray:
    """`messages.candidate()` in Arrow, true or false for each delivery row (its columns as
    records.Delivery's; tests/test_detectors.py holds the two to one answer over every combination
    of what they read)."""
    def known(values: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.fill_null(values, False)

    outcome = deliveries["outcome"]
    returning = pc.or_(known(pc.is_in(outcome, value_set=pa.array(BOUNCED_BY))),
                       pc.or_(known(deliveries["redelivered"]), known(pc.greater(deliveries["x_death_count"], 0))))
    left_at_close = pc.and_(known(pc.is_in(outcome, value_set=pa.array(CLOSED))),
                            pc.is_valid(deliveries["settle_ts_ns"]))
    return pc.and_(pc.is_valid(deliveries["message_identity"]), pc.or_(returning, left_at_close))
