"""Several tables through one grouped Arrow function: Spark takes one output schema per call, so
the tables travel as one wide table. A `record` column names each row's table (and `role` what the
caller is to do with it); each table's columns carry its name as a prefix."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

RECORD, ROLE = "record", "role"


def prefixed(table: str, column: str) -> str:
    return f"{table}__{column}"


def wide_schema(tables: dict[str, pa.Schema]) -> pa.Schema:
    return pa.schema([(RECORD, pa.string()), (ROLE, pa.string())] + [
        pa.field(prefixed(name, field.name), field.type) for name, table_schema in tables.items()
        for field in table_schema])


def to_wide(wide: pa.Schema, parts: list[tuple[str, str | None, pa.Table]]) -> pa.Table:
    """(table name, role, rows of that table) -> one table of `wide`."""
    out = [wide.empty_table()]
    for name, role, table in parts:
        n = table.num_rows
        columns = {RECORD: pa.array([name] * n, pa.string()), ROLE: pa.array([role] * n, pa.string())}
        for field in wide:
            if field.name not in columns:
                owner, _, column = field.name.partition("__")
                columns[field.name] = table.column(column) if owner == name else pa.nulls(n, field.type)
        out.append(pa.Table.from_pydict(columns, schema=wide))
    return pa.concat_tables(out)


def from_wide(wide: DataFrame, name: str, table_schema: pa.Schema, role: str | None = None) -> DataFrame:
    """The rows of one table (with one role), in that table's columns."""
    rows = wide.where(F.col(RECORD) == name)
    if role is not None:
        rows = rows.where(F.col(ROLE) == role)
    return rows.select(*[F.col(prefixed(name, field.name)).alias(field.name) for field in table_schema])


def records_from_wide(rows: pa.Table | pa.RecordBatch, name: str, record_type) -> list:
    """The rows of table `name` among `rows` (a wide table's Arrow rows, in Python), back as the
    frozen records whose fields are that table's columns (analyzer/timeline/records.py)."""
    mine = rows.filter(pc.equal(rows.column(RECORD), name))
    if not mine.num_rows:
        return []
    columns = [mine.column(prefixed(name, slot)).to_pylist() for slot in record_type.__slots__]
    return [record_type(*values) for values in zip(*columns)]
