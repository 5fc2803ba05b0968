"""Several tables through one Arrow function (Spark takes one output schema per call) as one wide
table: `record` names each row's table, `role` what the caller is to do with it, and each table's
row is a struct column named after the table, null in the other tables' rows. A struct, not a flat
column per table column: Spark keeps a row (in memory, and on disk when it spills) with a slot per
top-level field, null or not: a row of one table in ~170 flat columns cost ~1.4 KB before its values."""

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
