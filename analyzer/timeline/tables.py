"""Timeline records as Arrow tables: schema.DELIVERIES and schema.PUBLISHES, plus the channel
incarnation facts and protocol violations the detectors read (CHANNELS, VIOLATIONS below).

Rows are sorted by their key, so equal input gives byte-for-byte equal tables: what the Spark
timeline job's output is compared with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter

import pyarrow as pa

from .. import schema
from ..columns import record_columns, taken_array
from ..rows import columns_to_table, objects_to_table, stored_fields
from . import records as r
from .connection import replay

_str, _i32, _i64, _bool = pa.string(), pa.int32(), pa.int64(), pa.bool_()

# The frames columns the timelines read; nothing else of a frame row matters to them.
INPUT_COLUMNS = (
    "connection_id", "agent_id", "seq", "ts_ns", "direction", "channel", "method", "malformed",
    "delivery_tag", "multiple", "requeue", "redelivered", "exchange", "routing_key", "queue", "consumer_tag",
    "mandatory", "no_ack", "nowait", "prefetch_count", "prefetch_global", "reply_code", "reply_text",
    "failing_method", "message_id", "message_identity", "x_death_count", "delivery_mode", "body_size",
)
_ts = pa.timestamp("us", tz="UTC")

CHANNELS = pa.schema([
    ("date", _str),                      # UTC day of open_ts
    ("connection_id", _str), ("agent_id", _str),
    ("channel", _i32), ("incarnation", _i32),
    ("open_seq", _i64),                  # channel.open row (its first row if the open was not captured)
    ("open_ts", _ts), ("open_ts_ns", _i64),
    ("history_known", _bool),            # opened inside the capture with both directions in view
    ("gap_seen", _bool),                 # a capture gap or malformed frame fell inside its life
    ("end_seq", _i64), ("end_ts", _ts), ("end_ts_ns", _i64),  # the row it ended at; null at end of data
    ("ended_by", _str),                  # channel.close, connection.close, tcp.fin, tcp.rst, end_of_data, reopened, tag_restart
    ("closed_by", _str),                 # client or broker, for channel.close
    ("close_code", _i32), ("close_text", _str), ("failing_method", _str),
    ("confirm_mode", _bool), ("tx_mode", _bool),  # null: not known (history or a gap hides it)
    ("consumer_prefetch", _i32),         # basic.qos global=false in force at the end; 0 unlimited; null unknown
    ("channel_prefetch", _i32),          # basic.qos global=true in force at the end; 0 unlimited; null unknown
    ("consumes", _i64),                  # basic.consume frames
    ("unbounded_manual_consumes", _i64), # manual-ack basic.consume with no prefetch limit in force
    ("deliveries", _i64), ("publishes", _i64),
    ("peak_unacked", _i64),              # most manual-ack deliveries unacked at once
    ("observed_until_ts_ns", _i64),      # ended_by end_of_data: ts of the connection's last row
])
CHANNEL_TIMESTAMPS = {"open_ts": "open_ts_ns", "end_ts": "end_ts_ns"}

VIOLATIONS = pa.schema([
    ("date", _str),                      # UTC day of ts
    ("connection_id", _str), ("agent_id", _str),
    ("channel", _i32), ("incarnation", _i32),
    ("seq", _i64), ("ts", _ts), ("ts_ns", _i64),  # the offending frame (broker evidence: the broker's close)
    ("kind", _str),                      # double_ack, unknown_tag, wrong_channel
    ("evidence", _str),                  # capture (the frames show it) or broker (only its 406 does)
    ("method", _str),                    # basic.ack, basic.nack or basic.reject
    ("delivery_tag", _i64), ("multiple", _bool),
    ("delivered_channel", _i32), ("delivered_incarnation", _i32),  # wrong_channel: where the tag is unacked
    ("broker_close_seq", _i64), ("broker_reply_code", _i32), ("broker_reply_text", _str),
])
TS_ONLY = {"ts": "ts_ns"}

# record type -> (schema, derived timestamps, date source, sort key)
TABLES = {
    r.Delivery: (schema.DELIVERIES, schema.DELIVERY_TIMESTAMPS, schema.DELIVERY_DATE_FROM,
                 ("connection_id", "channel", "incarnation", "seq")),
    r.Publish: (schema.PUBLISHES, schema.PUBLISH_TIMESTAMPS, schema.PUBLISH_DATE_FROM,
                ("connection_id", "channel", "incarnation", "seq")),
    r.ChannelFacts: (CHANNELS, CHANNEL_TIMESTAMPS, "open_ts_ns", ("connection_id", "channel", "incarnation")),
    r.Violation: (VIOLATIONS, TS_ONLY, "ts_ns", ("connection_id", "channel", "incarnation", "seq", "kind")),
}


# table name -> the record type of its rows
RECORD_TYPES = {"deliveries": r.Delivery, "publishes": r.Publish, "channels": r.ChannelFacts, "violations": r.Violation}
# table name -> the columns its rows are sorted by
SORT_KEYS = {name: TABLES[record_type][3] for name, record_type in RECORD_TYPES.items()}


def by_type(records: Iterable) -> dict[type, list]:
    """Any mix of records sorted into their four types in one pass (every type a list, maybe
    empty); anything that is not a timeline record is left out."""
    grouped = {record_type: [] for record_type in TABLES}
    for x in records:
        of_type = grouped.get(type(x))
        if of_type is not None:
            of_type.append(x)
    return grouped


def tables_of(grouped: dict[type, list], ordered: bool = True) -> dict[str, pa.Table]:
    """The four tables of `by_type`'s lists, each sorted by its key (Arrow's sort is stable and
    orders strings as Python does, by code point: the order `sorted` gives, without a key tuple
    per record). `ordered=False`: in the records' order, for the passes, whose files are sorted
    whole in their writer's thread instead (wide_writes.FilesWriter's `order`): sorting each flush
    was ~9% of the pass's CPU in bench/pass_cpu.py, in the machine's thread."""
    out = {}
    for name, record_type in RECORD_TYPES.items():
        table_schema, timestamps, date_from, key = TABLES[record_type]
        table = objects_to_table(grouped[record_type], attrgetter, table_schema, timestamps, date_from)
        out[name] = _sorted(table, key) if ordered else table
    return out


def _sorted(table: pa.Table, key: tuple[str, ...]) -> pa.Table:
    return table.sort_by([(column, "ascending") for column in key])


class RecordTables:
    """Timeline records gathered for the four tables as they come (`append(record)`, what a
    machine's `out` takes), handed over as `tables_of` makes them by `take`, with how many records
    of class `counted` `predicate` said yes to.

    Where the C loop is built (columns.record_columns), `append` puts each record's fields straight
    onto Arrow columns and keeps nothing of the record, where the pass kept up to FLUSH_RECORDS
    records until its flush, grouped them by type and read each field back: ~280 against ~500 ns
    a record, ~1.8 of ~98 CPU s on the 10 M-frame bench lake (bench/README.md, session 46).
    Without it, the records are kept and converted at `take` (the reference; tests/test_columns.py
    holds the two to equal tables)."""

    def __init__(self, counted: type | None = None, predicate: Callable[[object], bool] | None = None):
        self.counted, self.predicate = counted, predicate
        # record type -> the fields its columns are built of, in the C builder's order
        self.fields = {record_type: stored_fields(table_schema, timestamps)
                       for record_type, (table_schema, timestamps, _, _) in TABLES.items()}
        self.builder = record_columns(self.fields, counted, predicate)
        self.records: list = []
        self.append = self.records.append if self.builder is None else self.builder.append

    def __len__(self) -> int:
        return len(self.records) if self.builder is None else len(self.builder)

    def take(self, ordered: bool = True) -> tuple[dict[str, pa.Table], int]:
        """Every record appended since the last take, as the four tables (`ordered`: as tables_of),
        and the count; gathering starts anew."""
        if self.builder is None:
            grouped = by_type(self.records)
            self.records.clear()
            count = sum(map(self.predicate, grouped.get(self.counted, ()))) if self.predicate is not None else 0
            return tables_of(grouped, ordered), count
        layouts, declined, count = self.builder.take()
        declined_tables = tables_of(by_type(declined), ordered=False) if declined else {}
        built, out = dict(zip(self.fields, layouts)), {}
        for name, record_type in RECORD_TYPES.items():
            table_schema, timestamps, date_from, key = TABLES[record_type]
            rows, buffers = built[record_type]
            columns = {field.name: taken_array(field.type, rows, taken)
                       for field, taken in zip(self.fields[record_type], buffers)}
            table = columns_to_table(columns, table_schema, timestamps, date_from)
            if name in declined_tables:
                table = pa.concat_tables([table, declined_tables[name]])
            out[name] = _sorted(table, key) if ordered else table
        return out, count


def to_tables(records: Iterable, ordered: bool = True) -> dict[str, pa.Table]:
    """The four tables (empty ones too) of any mix of records (`ordered`: as tables_of)."""
    return tables_of(by_type(records), ordered)


def replay_frames(frames: pa.Table, overdue_ns: int = r.DEFAULT_OVERDUE_NS) -> dict[str, pa.Table]:
    """A frames table (schema.FRAMES or just INPUT_COLUMNS, any order) through the timelines, as the four tables."""
    ordered = frames.select(INPUT_COLUMNS).sort_by([("connection_id", "ascending"), ("seq", "ascending")])
    return to_tables(replay(ordered.to_pylist(), overdue_ns))
