"""Spark types of the tables in `analyzer.schema`: the jobs and the agent share one definition of each table."""

import pyarrow as pa
from pyspark.sql import types as T

# Only exact equivalents: a type Spark would round-trip differently (nanosecond or zone-less
# timestamps, unsigned integers) is refused rather than silently changed.
_SPARK_TYPES = {
    pa.bool_(): T.BooleanType(),
    pa.int8(): T.ByteType(),
    pa.int16(): T.ShortType(),
    pa.int32(): T.IntegerType(),
    pa.int64(): T.LongType(),
    pa.float32(): T.FloatType(),
    pa.float64(): T.DoubleType(),
    pa.string(): T.StringType(),
    pa.binary(): T.BinaryType(),
    pa.date32(): T.DateType(),
    # Spark's TimestampType is an instant at microsecond precision, Delta's `timestamp`.
    pa.timestamp("us", tz="UTC"): T.TimestampType(),
}


def spark_schema(schema: pa.Schema) -> T.StructType:
    """The Spark schema of an Arrow table schema, field for field, nullability included."""
    return T.StructType([T.StructField(field.name, _spark_type(field), field.nullable) for field in schema])


def _spark_type(field: pa.Field) -> T.DataType:
    if pa.types.is_list(field.type):
        return T.ArrayType(_spark_type(field.type.value_field), field.type.value_field.nullable)
    if pa.types.is_struct(field.type):
        return spark_schema(pa.schema(list(field.type)))
    try:
        return _SPARK_TYPES[field.type]
    except KeyError:
        raise TypeError(f"column {field.name!r}: Arrow type {field.type} has no exact Spark type") from None
