"""Several tables through one grouped Arrow function: Spark takes one output schema per call, so
the tables travel as one wide table. A `record` column names each row's table (and `role` what the
caller is to do with it); each table's row is a struct column named after the table, null in the
other tables' rows.

A struct per table, not a flat column per table column: Spark keeps a row (in memory, and on disk
when it spills) with a fixed-width slot for each top-level field, null or not, so a
row of one table in ~170 flat columns costs ~1.4 KB before its values; a null struct costs one slot."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

RECORD, ROLE = "record", "role"


def wide_schema(tables: dict[str, pa.Schema]) -> pa.Schema:
    return pa.schema([(RECORD, pa.string()), (ROLE, pa.string())] + [
        pa.field(name, pa.struct(list(table_schema))) for name, table_schema in tables.items()])


def to_wide(wide: pa.Schema, parts: list[tuple[str, str | None, pa.Table]]) -> pa.Table:
    """(table name, role, rows of that table) -> one table of `wide`."""
    out = [wide.empty_table()]
    for name, role, table in parts:
        n = table.num_rows
        # One value repeated (pa.repeat, not a list of n Python strings: ~60x faster).
        columns = {RECORD: pa.repeat(pa.scalar(name, pa.string()), n), ROLE: pa.repeat(pa.scalar(role, pa.string()), n)}
        for field in wide:
            if field.name not in columns:
                columns[field.name] = (table.select(field.type.names).to_struct_array() if field.name == name
                                       else pa.nulls(n, field.type))
        out.append(pa.Table.from_pydict(columns, schema=wide))
    return pa.concat_tables(out)


def rows_from_wide(rows: pa.Table, name: str, table_schema: pa.Schema | None = None) -> pa.Table:
    """The rows of table `name` among a wide table's Arrow rows, as a table of its columns (those of
    `table_schema`, in its types; None: all of them)."""
    mine = rows.filter(pc.equal(rows.column(RECORD), name)).column(name)
    fields = table_schema if table_schema is not None else pa.schema(list(mine.type))
    return pa.Table.from_arrays([pc.struct_field(mine, field.name).cast(field.type) for field in fields],
                                schema=pa.schema(fields))


def as_records(rows: pa.Table, record_type) -> list:
    """A table's rows back as the frozen records whose fields are its columns (a timeline table's
    stored rows: analyzer/timeline/records.py)."""
    if not rows.num_rows:
        return []
    return [record_type(*values) for values in zip(*[rows[slot].to_pylist() for slot in record_type.__slots__])]
