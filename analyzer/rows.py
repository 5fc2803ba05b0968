"""Frame rows as they are produced, and their conversion to Arrow tables of `schema.FRAMES`.

The hot rows (acks and content methods, most of any capture) are tuples in a fixed layout,
turned into columns with one `zip` and one `pa.array` per column; a dict per row cost more
than decoding the frame. Rare methods stay dicts. Columns shared by every row of a connection
(its id, addresses, source) are stored once, under a key the connection keeps for its life, and
joined by that key at conversion. So are the
groups of columns a message shares with the messages before it: a content row holds its method
fields (all but the delivery tag) and its properties as two tuples the decode memo hands out
again and again, converted once per distinct tuple and spread over the rows by index. Runs of
messages that differ only in delivery tag and body (runs.py) go one step further: one record per
run, its shared values spread over its rows by index, seq counted up with numpy. Rows the native
lane makes (native.py) come as columns already: arrays of numbers, and lists of the shared tuples.
"""

import functools
import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .columns import record_column
from .schema import FRAMES

DIRECTION_NAMES = ("to_broker", "to_client")


@functools.cache
def _directions() -> pa.Array:
    # Built on first use, not at import: converting a Python sequence is when pyarrow probes for
    # pandas, which an ingest process answers first without pandas (pandas_probe).
    return pa.array(DIRECTION_NAMES)

# Leading columns of every row; `conn` is the connection's key in RowSink.connections.
PREFIX = ("conn", "seq", "ts_ns", "direction", "channel", "method", "source_packet")
CONNECTION_COLUMNS = ("connection_id", "agent_id", "source", "client_addr", "client_port", "server_addr", "server_port")
ACK_FIELDS = ("delivery_tag", "multiple", "requeue")
# A content method's fields but its delivery tag: the same from message to message of a stream.
SHARED_METHOD_FIELDS = ("redelivered", "exchange", "routing_key", "consumer_tag", "mandatory", "immediate",
                        "reply_code", "reply_text", "message_count")
CONTENT_METHOD_FIELDS = ("delivery_tag",) + SHARED_METHOD_FIELDS
PROPERTY_FIELDS = ("content_type", "content_encoding", "headers", "delivery_mode", "priority",
                   "correlation_id", "reply_to", "expiration", "message_id", "message_timestamp",
                   "message_type", "user_id", "app_id", "x_death_count")
ACK_LAYOUT = PREFIX + ACK_FIELDS
# Entries that are tuples of field names hold one shared tuple of those fields per row.
CONTENT_LAYOUT = PREFIX + ("delivery_tag", SHARED_METHOD_FIELDS, "body_size", "content_complete", PROPERTY_FIELDS,
                           "body_hash", "message_identity")
# A run of content rows (RowSink.add_content_run): CONTENT_LAYOUT less what differs from row to row,
# with seq the run's first; a row count follows.
RUN_LAYOUT = PREFIX + (SHARED_METHOD_FIELDS, "body_size", "content_complete", PROPERTY_FIELDS)
# The native lane's method columns hold indices into these (analyzer/_lane.c).
LANE_ACK_METHODS = ("basic.ack", "basic.nack", "basic.reject")
LANE_CONTENT_METHODS = ("basic.publish", "basic.deliver", "basic.get-ok", "basic.return")


class UnplacedRow(RuntimeError):
    """A row names a connection the sink no longer knows: a bug of ours, never the wire's. Writing
    the row anyway would file it under the wrong connection (or crash on a bad index), so nothing
    of the batch is converted."""


class RowSink:
    """Collects one batch of frame rows; `take()` hands them over as an Arrow table and starts anew."""

    def __init__(self):
        # Constants per connection, by a key that never changes while any row or pending content
        # may hold it: rows wait for their content frames across takes, and a position in a list
        # that is compacted would send them to another connection.
        self.connections: dict[int, tuple] = {}
        self._next_key = 0
        self.acks: list[tuple] = []
        self.contents: list[tuple] = []      # content rows as they come one by one, in CONTENT_LAYOUT
        self.others: list[dict] = []
        # Runs of messages (runs.py) as run records in RUN_LAYOUT, each with its row count: what
        # the rows of a run share is kept once, and spread over them by index at conversion. What
        # differs from row to row goes to lists of its own. Single rows that came before a run
        # are turned into runs of one, so the rows keep their order.
        self.content_runs: list[tuple] = []
        self.run_tags: list = []
        self.run_hashes: list = []
        self.run_identities: list = []
        self.run_rows = 0
        self.lane = None  # the native lane's engine (native.py), which keeps its rows as columns

    def add_connection(self, constants: tuple) -> int:
        key = self._next_key
        self._next_key += 1
        self.connections[key] = constants
        return key

    def forget_connection(self, key: int) -> None:
        """The connection will make no more rows (its flow is forgotten): its constants go."""
        self.connections.pop(key, None)

    def __len__(self) -> int:
        lane_rows = self.lane.rows() if self.lane is not None else 0
        return len(self.acks) + len(self.contents) + self.run_rows + len(self.others) + lane_rows

    def add_content_run(self, conn: int, first_seq: int, ts_ns: int, direction: int, channel: int, method: str,
                        packet: int, tags, shared: tuple, body_size: int, properties: tuple,
                        hashes: list[str], identities: list) -> None:
        """Complete content rows of consecutive messages (seq first_seq, first_seq + 1, ...) that
        differ only in delivery tag, body hash and identity, after the rows before them."""
        if self.contents:
            self._singles_as_runs()
        k = len(hashes)
        self.content_runs.append((conn, first_seq, ts_ns, direction, channel, method, packet, shared, body_size,
                                  True, properties, k))
        self.run_tags += tags
        self.run_hashes += hashes
        self.run_identities += identities
        self.run_rows += k

    def _singles_as_runs(self) -> None:
        runs = self.content_runs
        for row in self.contents:
            runs.append(row[:7] + row[8:12] + (1,))
        _, _, _, _, _, _, _, tags, _, _, _, _, hashes, identities = zip(*self.contents)
        self.run_tags += tags
        self.run_hashes += hashes
        self.run_identities += identities
        self.run_rows += len(self.contents)
        self.contents = []

    def take(self) -> pa.Table:
        if self.content_runs:
            if self.contents:
                self._singles_as_runs()
            contents = _runs_table(self.content_runs, self.run_tags, self.run_hashes, self.run_identities)
        else:
            contents = _layout_table(self.contents, CONTENT_LAYOUT)
        parts = [_layout_table(self.acks, ACK_LAYOUT), contents, _dict_table(self.others)]
        if self.lane is not None:  # after the Python path's rows: the order of rows in a batch means nothing
            parts += _lane_tables(*self.lane.take_rows())
        self.acks, self.contents, self.others = [], [], []
        self.content_runs, self.run_tags, self.run_hashes, self.run_identities = [], [], [], []
        self.run_rows = 0
        parts = [p for p in parts if p is not None]
        if not parts:
            return FRAMES.empty_table()
        table = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
        return self._finish(table)

    def _finish(self, partial: pa.Table) -> pa.Table:
        """Join connection constants, name directions, derive ts/date, and order columns as the schema says."""
        keys = pa.array(list(self.connections), type=pa.int32())
        at = pc.index_in(partial["conn"], value_set=keys)
        if at.null_count:
            unknown = sorted(set(pc.filter(partial["conn"], pc.is_null(at)).to_pylist()))
            raise UnplacedRow(f"{at.null_count} frame row(s) name connection key(s) {unknown[:5]} the sink does not hold")
        constants = list(zip(*self.connections.values()))
        by_name = {name: partial[name] for name in partial.column_names}
        for name, values in zip(CONNECTION_COLUMNS, constants):
            by_name[name] = pa.array(values, type=FRAMES.field(name).type).take(at)
        by_name["direction"] = _directions().take(partial["direction"])
        ts = _ns_to_timestamp(partial["ts_ns"])
        by_name["ts"] = ts
        by_name["date"] = ts.cast(pa.date32()).cast(pa.string())
        n = partial.num_rows
        columns = [by_name[f.name] if f.name in by_name else pa.nulls(n, f.type) for f in FRAMES]
        return pa.Table.from_arrays(columns, schema=FRAMES)


_TYPES = {f.name: f.type for f in FRAMES}
_TYPES.update(conn=pa.int32(), direction=pa.int8())


def _layout_table(rows: list[tuple], layout: tuple) -> pa.Table | None:
    if not rows:
        return None
    arrays, names = [], []
    for entry, values in zip(layout, zip(*rows)):
        if isinstance(entry, tuple):
            arrays += _shared_columns(values, entry)
            names += entry
        else:
            arrays.append(pa.array(values, type=_TYPES[entry]))
            names.append(entry)
    return pa.Table.from_arrays(arrays, names=names)


def _runs_table(runs: list[tuple], tags: list, hashes: list, identities: list) -> pa.Table:
    """Content rows from run records: each run's shared values converted once and spread over its
    rows by index; seq counted up from each run's first."""
    columns = list(zip(*runs))
    counts = np.array(columns[-1], dtype=np.int64)
    spread = np.repeat(np.arange(len(runs), dtype=np.int32), counts)
    spread_array = pa.array(spread)
    by_name = {}
    for entry, values in zip(RUN_LAYOUT, columns):
        if entry == "seq":  # each row's seq: its run's first, plus its place in the run
            firsts = np.array(values, dtype=np.int64) - (np.cumsum(counts) - counts)
            by_name[entry] = pa.array(firsts[spread] + np.arange(len(spread), dtype=np.int64), type=_TYPES[entry])
        elif isinstance(entry, tuple):
            by_name.update(zip(entry, _shared_columns(values, entry, spread)))
        else:
            by_name[entry] = pa.array(values, type=_TYPES[entry]).take(spread_array)
    for name, values in (("delivery_tag", tags), ("body_hash", hashes), ("message_identity", identities)):
        by_name[name] = pa.array(values, type=_TYPES[name])
    names = [name for entry in CONTENT_LAYOUT for name in (entry if isinstance(entry, tuple) else (entry,))]
    return pa.Table.from_arrays([by_name[name] for name in names], names=names)


def _lane_tables(acks: tuple, contents: tuple) -> list[pa.Table]:
    """Tables of the rows the native lane made, from its columns (see Engine.take_rows in _lane.c)."""
    tables = []
    n, conn, seq, ts_ns, direction, channel, method, packet, tag, multiple, requeue = acks
    if n:
        columns = _lane_prefix(conn, seq, ts_ns, direction, channel, method, packet, LANE_ACK_METHODS)
        columns.update(delivery_tag=pa.array(np.frombuffer(tag, np.int64)), multiple=_lane_flags(multiple),
                       requeue=_lane_flags(requeue))
        tables.append(pa.table(columns))
    (n, conn, seq, ts_ns, direction, channel, method, packet, tag, has_tag, body_size, has_size, complete,
     shared, properties, hashes, identities) = contents  # the last four: (distinct objects, int32 index per row)
    if n:
        columns = _lane_prefix(conn, seq, ts_ns, direction, channel, method, packet, LANE_CONTENT_METHODS)
        columns["delivery_tag"] = pa.array(np.frombuffer(tag, np.int64), mask=np.frombuffer(has_tag, np.int8) == 0)
        columns.update(zip(SHARED_METHOD_FIELDS, _indexed_columns(shared[0], _int32s(shared[1]), SHARED_METHOD_FIELDS)))
        columns["body_size"] = pa.array(np.frombuffer(body_size, np.int64), mask=np.frombuffer(has_size, np.int8) == 0)
        columns["content_complete"] = pa.array(np.frombuffer(complete, np.int8) == 1)
        columns.update(zip(PROPERTY_FIELDS, _indexed_columns(properties[0], _int32s(properties[1]), PROPERTY_FIELDS)))
        for name, (values, at) in (("body_hash", hashes), ("message_identity", identities)):
            columns[name] = pa.array(values, type=_TYPES[name]).take(_int32s(at))
        tables.append(pa.table(columns))
    return tables


def _lane_prefix(conn: bytes, seq: bytes, ts_ns: bytes, direction: bytes, channel: bytes, method: bytes,
                 packet: bytes, methods: tuple) -> dict:
    return {"conn": pa.array(np.frombuffer(conn, np.int32)), "seq": pa.array(np.frombuffer(seq, np.int64)),
            "ts_ns": pa.array(np.frombuffer(ts_ns, np.int64)), "direction": pa.array(np.frombuffer(direction, np.int8)),
            "channel": pa.array(np.frombuffer(channel, np.int32)),
            "method": pa.array(methods).take(pa.array(np.frombuffer(method, np.int8))),
            "source_packet": pa.array(np.frombuffer(packet, np.int64))}


def _int32s(values: bytes) -> pa.Array:
    return pa.array(np.frombuffer(values, np.int32))


def _lane_flags(values: bytes) -> pa.Array:
    """0 false, 1 true, 2 null."""
    flags = np.frombuffer(values, np.int8)
    return pa.array(flags == 1, mask=flags == 2)


def _shared_columns(groups: tuple, names: tuple, spread=None) -> list[pa.Array]:
    """Columns from one shared tuple per row (or per run, spread over rows by `spread`): each
    distinct tuple object is converted once and taken by index. Identity, not equality, picks them
    out (the rows keep every tuple alive, so ids are unique); equal tuples that are separate objects
    are merely converted twice."""
    ids = list(map(id, groups))
    distinct = dict(zip(ids, groups))
    position = {key: n for n, key in enumerate(distinct)}
    indices = np.fromiter(map(position.__getitem__, ids), dtype=np.int32, count=len(ids))
    if spread is not None:
        indices = indices[spread]
    return _indexed_columns(list(distinct.values()), pa.array(indices), names)


def _indexed_columns(distinct: list, indices: pa.Array, names: tuple) -> list[pa.Array]:
    """Columns of rows that hold `distinct[indices[i]]`, each field converted once per distinct tuple.
    A field no tuple sets is a column of nulls at once (most of a content row's fields, usually)."""
    n = len(indices)
    return [pa.array(column, type=_TYPES[name]).take(indices) if column.count(None) < len(column)
            else pa.nulls(n, _TYPES[name]) for name, column in zip(names, zip(*distinct))]


def _dict_table(rows: list[dict]) -> pa.Table | None:
    """Rare methods: rows of one method share their keys, so group by key set and build column-wise."""
    if not rows:
        return None
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        shape = tuple(row)
        group = groups.get(shape)
        if group is None:
            groups[shape] = group = []
        group.append(row)
    names = list(PREFIX) + [f.name for f in FRAMES if f.name not in PREFIX and f.name not in CONNECTION_COLUMNS
                            and f.name not in ("ts", "date")]
    tables = []
    for shape, group in groups.items():
        present = set(shape)
        n = len(group)
        tables.append(pa.Table.from_arrays(
            [pa.array([row[name] for row in group], type=_TYPES[name]) if name in present else pa.nulls(n, _TYPES[name])
             for name in names], names=names))
    return pa.concat_tables(tables)


def dicts_to_table(rows: list[dict], schema: pa.Schema, ts_columns: dict[str, str], date_from: str) -> pa.Table:
    """Plain dict rows (the connections table) -> `schema`, deriving timestamps and the date partition."""
    return objects_to_table(rows, functools.partial(operator.methodcaller, "get"), schema, ts_columns, date_from)


def objects_to_table(items: list, reader, schema: pa.Schema, ts_columns: dict[str, str], date_from: str) -> pa.Table:
    """Rows as objects (`reader(name)`: a function reading that column off an item, as
    operator.attrgetter makes them) -> `schema`, deriving timestamps and the date partition. One
    list per column, no dict per row."""
    n = len(items)
    columns = {}
    for field in stored_fields(schema, ts_columns):
        name = field.name
        column = record_column(items, name, field.type) if reader is operator.attrgetter else None
        if column is None:
            column = pa.array(list(map(reader(name), items)), type=field.type) if n else pa.nulls(0, field.type)
        columns[name] = column
    return columns_to_table(columns, schema, ts_columns, date_from)


def stored_fields(schema: pa.Schema, ts_columns: dict[str, str]) -> list[pa.Field]:
    """The fields of `schema` a row object holds: all but `date` and the timestamps derived from `_ns`."""
    return [field for field in schema if field.name not in ts_columns and field.name != "date"]


def columns_to_table(columns: dict[str, pa.Array], schema: pa.Schema, ts_columns: dict[str, str],
                     date_from: str) -> pa.Table:
    """`stored_fields`' columns -> `schema`, deriving timestamps and the date partition."""
    for name, source in ts_columns.items():
        columns[name] = _ns_to_timestamp(columns[source])
    columns["date"] = _ns_to_timestamp(columns[date_from]).cast(pa.date32()).cast(pa.string())
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def _ns_to_timestamp(ns):
    return pc.divide(ns, 1000).cast(pa.timestamp("us", tz="UTC"))
