"""Arrow columns to and from Python objects: the two edges of the connection pass, in C where it is built.

The pass hands every frame to the state machine as a mapping and every record back to Arrow
(spark_jobs/connection_pass.py: as the machine hands each off, `record_columns`; records it does
not take, a column at a time, `record_column`). In Python, the dicts cost ~1.5 µs per frame and
the columns ~1.5 µs per frame, a third of the pass outside the rules. `analyzer/_columns.c` does
both conversions without a Python list per column in between, its rows compact read-only `Row`s
(analyzer/_row.h) that timeline/_plain.c reads in place; it takes only the layouts and values it
knows exactly and leaves everything else to pyarrow's own conversion, which stays the reference
(tests/test_columns.py compares the two on the same batches and records). Nothing here knows a rule.

ACKSCOPE_PURE_PYTHON=1 switches the compiled paths off (as for the decode lane, analyzer/native.py);
without the compiled module there are none.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial

import pyarrow as pa

from . import pure_python

try:
    from . import _columns
except ImportError:  # not compiled (setup.py marks it optional): pyarrow converts everything
    _columns = None
else:
    Mapping.register(_columns.Row)


def available() -> bool:
    return _columns is not None


def enabled() -> bool:
    return _columns is not None and not pure_python()


# -- batches in: a row per frame ---------------------------------------------------------------------

def batch_rows(batch: pa.RecordBatch | pa.Table) -> Iterator[Mapping] | list[Mapping]:
    """The batch's (or table's) rows, equal to `batch.to_pylist()`'s dicts: from the C loop, a list
    of `Row`s (analyzer/_row.h: read-only Mappings, every column a key), else dicts."""
    names = batch.schema.names
    if enabled() and len(set(names)) == len(names):  # a name twice: the last value wins, even a null
        columns = _row_columns(batch)
        if columns is not None:
            return _columns.rows(tuple(names), columns, batch.num_rows)
    return python_batch_rows(batch)


def python_batch_rows(batch: pa.RecordBatch | pa.Table) -> Iterator[dict]:
    """The reference: each column to Python at once, then one dict per row from the zipped values
    (a third less CPU than `to_pylist`)."""
    names = batch.schema.names
    return map(dict, map(partial(zip, names), zip(*[column.to_pylist() for column in batch.columns])))


def _row_columns(batch: pa.RecordBatch | pa.Table) -> tuple | None:
    specs = []
    for column in batch.columns:
        if isinstance(column, pa.ChunkedArray):  # a table's: read whole only as one chunk
            if column.num_chunks != 1:
                return None
            column = column.chunk(0)
        kind = _ROW_KINDS.get(column.type)  # None: a type the C loop does not read (pyarrow does it all)
        if kind is None:
            return None
        buffers = column.buffers()
        if kind == _columns.NULL:
            specs.append((kind, 0, None, None, None))
        elif kind in _OFFSET_KINDS:
            specs.append((kind, column.offset, buffers[0], buffers[2], buffers[1]))
        else:
            specs.append((kind, column.offset, buffers[0], buffers[1], None))
    return tuple(specs)


# -- records out: a column per field -----------------------------------------------------------------

def record_column(items: list, name: str, arrow_type: pa.DataType) -> pa.Array | None:
    """Field `name` of `items` (records of one slotted class, such as timeline/records.py's) as an
    Arrow array of `arrow_type`, equal to `pa.array([x.<name> for x in items], type=arrow_type)`;
    None where the C loop does not take them (the caller converts them itself)."""
    if not enabled() or not items:
        return None
    kind = _RECORD_KINDS.get(arrow_type)
    slot = type(items[0]).__dict__.get(name)
    if kind is None or slot is None:
        return None
    taken = _columns.record_column(items, slot, kind)
    if taken is None:
        return None
    return taken_array(arrow_type, len(items), taken)


def taken_array(arrow_type: pa.DataType, length: int, taken: tuple) -> pa.Array:
    """The Arrow array of the C loops' buffers for one column: (validity or None, data, offsets or
    None, null count), as record_column and RecordColumns.take hand them."""
    validity, data, offsets, nulls = taken
    buffers = [None if validity is None else pa.py_buffer(validity)]
    buffers += [pa.py_buffer(offsets), pa.py_buffer(data)] if offsets is not None else [pa.py_buffer(data)]
    return pa.Array.from_buffers(arrow_type, length, buffers, null_count=nulls)


def record_columns(layouts: dict[type, list[pa.Field]], counted: type | None = None, predicate=None):
    """A builder of Arrow columns out of records of slotted classes as they come, in C:
    `append(record)` puts the record's fields (`layouts[type(record)]`, each a slot of its class)
    onto its class's columns and keeps nothing of the record; a record of another class, or with a
    value record_column would not take, is kept as it is among the declined. `take()` hands over
    `(((rows, buffers per field), ...) per layout, declined records, count)` and starts anew, the
    buffers as `taken_array` reads them; `count`: the records of class `counted` for which
    `predicate(record)` is true. None where the C loop is off, or a field is of a type it does not
    write (the caller keeps the records and converts them with record_column)."""
    if not enabled():
        return None
    specs = []
    for record_type, fields in layouts.items():
        spec = []
        for field in fields:
            kind, slot = _RECORD_KINDS.get(field.type), record_type.__dict__.get(field.name)
            if kind is None or slot is None:
                return None
            spec.append((slot, kind))
        specs.append((record_type, tuple(spec)))
    return _columns.RecordColumns(tuple(specs), counted, predicate)


# Arrow type -> the C loops' name for it: what rows read, and the part of it records are written as.
_RECORD_KINDS = {} if _columns is None else {
    pa.int64(): _columns.INT64, pa.int32(): _columns.INT32, pa.bool_(): _columns.BOOL, pa.string(): _columns.UTF8}
_ROW_KINDS = {} if _columns is None else {
    **_RECORD_KINDS, pa.int16(): _columns.INT16, pa.int8(): _columns.INT8, pa.null(): _columns.NULL,
    pa.large_string(): _columns.LARGE_UTF8, pa.binary(): _columns.BINARY, pa.large_binary(): _columns.LARGE_BINARY}
# Values between offsets (str or bytes): their buffers are (validity, offsets, data).
_OFFSET_KINDS = () if _columns is None else (_columns.UTF8, _columns.LARGE_UTF8, _columns.BINARY,
                                             _columns.LARGE_BINARY)
