"""Delta tables into Spark, with the Delta Lake JARs (native) or without them (bridge), and the
driver's rewrites of the analysis tables (`replace_all`).

A bridge read hands Spark exactly the snapshot's files that delta-rs resolves, and the partition
values Spark sees are checked against the log's (Delta keeps them in the log, not in the files).
The analysis writes its tables with delta-rs only (pyarrow files, one Delta commit each), so every
reader (delta-spark, `deltalake`, `analyzer.lake.read_table`) sees the same tables. What the driver
does with the store's files (which to read, commit logs, commits) is in table_files.py, their
listing in analyzer.lake (`table_files`, as the agent lists them), the same for a local and an S3 lake.
"""

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import reduce
from itertools import groupby
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analyzer.lake import Bounds, TableFile, TableWriter, any_within, filesystem, open_table, scan, table_files
from analyzer.schema import PARTITION_BY

from . import session
from .provisional import PROVISIONAL
from .table_files import OPEN_COST_BYTES, commit, files_that_may_hold, files_to_read, spark_location
from .types import spark_schema
from .wide_writes import FilesWriter, add_actions

# A file costs a reader as much to open as this many bytes to read (table_files.OPEN_COST_BYTES):
# a rewrite whose searched files hold no more in all rewrites them all, unsearched, into as few
# files as their rows fill, which costs the driver little and spares every later read the small
# files.
REWRITTEN_WHOLE_BYTES = OPEN_COST_BYTES


def read_delta(spark: SparkSession, lake: str, name: str, schema: pa.Schema | None = None, mode: str = "auto",
               since: date | str | None = None, until: date | str | None = None,
               version: int | None = None, files_where: str | None = None) -> DataFrame:
    """The table's current snapshot (or the one at `version`), in `schema` (by default the table's own).

    `since` and `until` are UTC days, both inclusive, and select `date` partitions; a datetime
    selects the day it falls on. A missing table reads as an empty DataFrame of `schema`.
    `mode` is the Delta path: auto, native or bridge (see `session.delta_mode`). `files_where`: a
    boolean column: only its true (or null) rows, read from only the files whose statistics say it
    may be true (table_files.files_that_may_hold; delta-spark skips files by the same statistics)."""
    table = open_table(lake, name)
    if table is not None and version is not None:
        table.load_as_version(version)
    if schema is None:
        if table is None:
            raise FileNotFoundError(f"no Delta table {name!r} in {lake}, and no schema to make an empty one")
        schema = pa.schema(table.schema().to_arrow())
    struct = spark_schema(schema)
    days = (_utc_day(since), _utc_day(until))
    route = session.delta_mode(spark, mode)
    if table is None:
        return spark.createDataFrame([], struct)
    if days != (None, None) and "date" not in table.metadata().partition_columns:
        raise ValueError(f"table {name!r} is not partitioned by date: since/until cannot select its days")
    location = os.path.join(lake, name)
    if route == "native":
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        data = _in_days(reader.load(spark_location(location)), *days)
    else:
        only = files_that_may_hold(table, files_where) if files_where is not None else None
        data = _read_bridge(spark, table, location, struct, *days, only=only)
    if files_where is not None:
        data = data.where(F.col(files_where).isNull() | (F.col(files_where) == True))  # noqa: E712
    return _schema_contract(data, struct)


def read_files(spark: SparkSession, lake: str, name: str, files: tuple[str, ...], columns: list[str]) -> DataFrame:
    """Data columns (no partition columns) of exactly these Parquet files of a table."""
    table_schema = pa.schema(DeltaTable(os.path.join(lake, name)).schema().to_arrow())
    struct = spark_schema(pa.schema([table_schema.field(c) for c in columns]))
    if not files:
        return spark.createDataFrame([], struct)
    return spark.read.schema(struct).parquet(*files)


@dataclass(frozen=True)
class Match:
    """Rows equal to one of `keys` on the columns `on` (a null matches none); with `at_least`
    (column, key column), only those whose column is at least the smallest key column of their
    key's rows."""
    keys: pa.Table
    on: tuple[str, ...]
    at_least: tuple[str, str] | None = None


@dataclass(frozen=True)
class Listed:
    """Rows whose every column named holds one of its listed values."""
    values: dict[str, tuple]


@dataclass(frozen=True)
class Keyed:
    """Rows whose columns `on` hold one of `keys`, tuples the driver holds (a null matches none)."""
    on: tuple[str, ...]
    keys: frozenset[tuple]


def connections_match(keys: list[str], **also: tuple) -> Listed:
    """The rows of these connections (and, per column of `also`, one of its values)."""
    return Listed({"connection_id": tuple(keys), **also})


def doomed(rows: pa.Table | pa.RecordBatch, matches: list["Match | Listed | Keyed"]) -> pa.Array:
    """Does any of `matches` name each row: a replace's one rule (`rewrite`). A null matches no
    listed value, nor any key."""
    hit = pa.repeat(pa.scalar(False), rows.num_rows)
    for match in matches:
        if isinstance(match, Listed):
            named = reduce(pc.and_, [pc.is_in(rows[column], value_set=pa.array(list(values), rows[column].type))
                                     for column, values in match.values.items()])
        else:
            named = _keyed(rows, _as_keys(match))
        hit = pc.or_(hit, pc.fill_null(named, False))
    return hit


def _as_keys(match: "Match | Keyed") -> Match:
    """Keyed tuples as a Match of Arrow keys (their types the row's: `_keyed` casts them)."""
    if isinstance(match, Match):
        return match
    columns = list(zip(*match.keys)) if match.keys else [() for _ in match.on]
    return Match(pa.table({column: pa.array(list(values)) if values else pa.nulls(0)
                           for column, values in zip(match.on, columns)}), match.on)


def _keyed(rows: pa.Table | pa.RecordBatch, match: Match) -> pa.Array:
    """Which rows a Match of Arrow keys names: a hash join of their key columns with the keys."""
    on = list(match.on)
    position = pa.array(range(rows.num_rows), pa.int64())
    columns = on + ([match.at_least[0]] if match.at_least else [])
    mine = pa.table([rows[column] for column in columns] + [position], names=[*columns, "_row"])
    keys = match.keys.select(on + ([match.at_least[1]] if match.at_least else []))
    keys = pa.table([keys[column].cast(mine[column].type) for column in on]
                    + ([keys[match.at_least[1]]] if match.at_least else []),
                    names=[*on, *(["_from"] if match.at_least else [])])
    if match.at_least:
        keys = keys.group_by(on, use_threads=False).aggregate([("_from", "min")])
        keys = keys.rename_columns(["_from" if name == "_from_min" else name for name in keys.column_names])
    else:
        keys = keys.group_by(on, use_threads=False).aggregate([])
    joined = mine.join(keys, keys=on, join_type="inner", use_threads=False)
    if match.at_least:
        joined = joined.filter(pc.greater_equal(joined[match.at_least[0]], joined["_from"]))
    return pc.is_in(position, value_set=joined["_row"].combine_chunks())


@dataclass(frozen=True)
class Replacement:
    """One table's part of `replace_all`: the rows `matches` names deleted, `rows` appended (None:
    none, but for files already written: replace_all's `written`). `provisional_only`: the caller
    knows every such row is a provisional one (provisional.py), so only the files that may hold
    those are searched."""
    rows: pa.Table | None
    schema: pa.Schema
    matches: list[Match | Listed | Keyed]
    provisional_only: bool = False


def replace_all(lake: str, replacements: dict[str, Replacement],
                written: dict[str, list[AddAction]] | None = None) -> dict[str, int | None]:
    """Each table's Replacement (by name) made (`rewrite_all`), then committed, each table in its
    commit (a missing table is created by it). `written`: files of new rows already written into a
    table's folder (by a pass, wide_writes.FilesWriter), committed with its new rows. Returns each
    table's new version, or None where there was nothing to do."""
    written = written or {}
    return {name: rewrite.commit(written.get(name, [])) for name, rewrite in rewrite_all(lake, replacements).items()}


@dataclass(frozen=True)
class Rewrite:
    """One table's Replacement made, not committed yet: the files it removes (by their paths relative
    to the table) and those it adds (written into the table's folder; no log names them yet)."""
    table: DeltaTable | None
    lake: str
    name: str
    schema: pa.Schema
    removed: dict[str, TableFile]
    adds: list[AddAction]

    def commit(self, written: list[AddAction] = ()) -> int | None:
        """Removed and added in one commit, with more files already written (`written`); the new
        version, or None when there was nothing to do."""
        adds = [*self.adds, *written]
        if self.table is not None and not adds and not self.removed:
            return None
        commit(os.path.join(self.lake, self.name), self.schema, adds, PARTITION_BY, tag=session.commit_tag(),
               table=self.table, removed=self.removed)
        return open_table(self.lake, self.name).version()

    def discard(self) -> None:
        """The files it wrote deleted (no log names them), the table left as it was."""
        fs, root = filesystem(os.path.join(self.lake, self.name))
        for add in self.adds:
            fs.delete_file(f"{root}/{add.path}")


def rewrite_all(lake: str, replacements: dict[str, Replacement]) -> dict[str, Rewrite]:
    """Each table's Replacement up to its commit (`rewrite`)."""
    return {name: rewrite(lake, name, replaced) for name, replaced in replacements.items()}


def rewrite(lake: str, name: str, replaced: Replacement) -> Rewrite:
    """Copy-on-write, as Delta's MERGE does it, by the driver: each searched file holding a row the
    matches name (`doomed`) rewritten without those rows, and the new rows written; the rest of the
    table untouched. Searched: every file, or with `provisional_only` those that may hold a
    provisional row; files of REWRITTEN_WHOLE_BYTES at most in all are all rewritten, unsearched."""
    table = open_table(lake, name)
    searched = table_files(table) if table is not None else {}
    if table is not None and replaced.provisional_only:
        provisional = files_that_may_hold(table, PROVISIONAL)
        searched = {path: file for path, file in searched.items() if path in provisional}
    files = FilesWriter(lake, name, replaced.schema)
    removed = {}
    if searched and replaced.matches:
        whole = sum(file.size for file in searched.values()) <= REWRITTEN_WHOLE_BYTES
        for path, rows, hit in (_every_file if whole else _search)(table, replaced, searched, files.writer):
            removed[path] = searched[path]
            files.add(rows.filter(pc.invert(hit)))
    if replaced.rows is not None and replaced.rows.num_rows:
        files.add(replaced.rows.select(replaced.schema.names))
    return Rewrite(table, lake, name, replaced.schema, removed, add_actions(files.files().to_pylist()).get(name, []))


def _every_file(table: DeltaTable, replaced: Replacement, searched: dict[str, TableFile],
                writer: TableWriter) -> Iterator[tuple[str, pa.Table, pa.Array]]:
    """Each searched file, read whole: its path, its rows and which of them are doomed."""
    for path, file in searched.items():
        rows = writer.read_file(path, file.partition_values.get("date"))
        yield path, rows, doomed(rows, replaced.matches)


def _search(table: DeltaTable, replaced: Replacement, searched: dict[str, TableFile],
            writer: TableWriter) -> Iterator[tuple[str, pa.Table, pa.Array]]:
    """The searched files holding a doomed row, as `_every_file` gives them: found by the columns
    the matches read, streamed (lake.scan), a file or row group whose statistics say it holds none
    of the values matched left unread; only those then read whole. A pass's file holds the
    connections of one hash, spread over the whole range of ids: the bounds of most files take in
    a key they do not hold, and reading only the matched columns to find out keeps the search cheap
    (reading every column instead: 1.6-3.8 s against 0.2-0.3 s, 20 files of 28 MB whose bounds
    each take in a key they do not hold)."""
    matches = replaced.matches
    columns = sorted({column for match in matches for column in _read_by(match)})
    lake, name = os.path.split(writer.path)
    batches = scan(lake, name, replaced.schema, columns, version=table.version(), files=set(searched),
                   bounded=tuple(columns), may_hold=_may_match(matches))
    for path, read in groupby(batches, key=itemgetter(0)):
        if any(pc.any(doomed(batch, matches)).as_py() for _, batch in read):
            rows = writer.read_file(path, searched[path].partition_values.get("date"))
            yield path, rows, doomed(rows, matches)


def _read_by(match: Match | Listed | Keyed) -> tuple[str, ...]:
    if isinstance(match, Listed):
        return tuple(match.values)
    return (*match.on, *(match.at_least[:1] if isinstance(match, Match) and match.at_least else ()))


def _may_match(matches: list[Match | Listed | Keyed]) -> Callable[[Bounds], bool]:
    """Statistics' test (lake.scan's `may_hold`): may rows whose bounds are these hold a row one of
    `matches` names? Not where, for each match, some column it names has none of its values
    within its bounds (a Match's `at_least` is not tested: it only narrows)."""
    named = []
    for match in matches:
        if isinstance(match, Listed):
            values = match.values
        else:
            keys = _as_keys(match).keys
            values = {column: keys[column].to_pylist() for column in match.on}
        named.append({column: sorted(v for v in set(listed) if v is not None) for column, listed in values.items()})
    return lambda bounds: any(all(any_within(listed, bounds.get(column)) for column, listed in columns.items())
                              for columns in named)


def _schema_contract(df: DataFrame, struct: T.StructType) -> DataFrame:
    """Exactly the schema's columns, in its order and types."""
    types = {field.name: field.dataType for field in df.schema}
    missing = [field.name for field in struct if field.name not in types]
    if missing:
        raise ValueError(f"the DataFrame lacks the table's columns {missing}")
    # A cast is several JVM round trips per column: only where the type differs.
    return df.select(*[field.name if types[field.name] == field.dataType
                       else F.col(field.name).cast(field.dataType).alias(field.name) for field in struct])


def _in_days(df: DataFrame, since: str | None, until: str | None) -> DataFrame:
    if since is not None:
        df = df.where(F.col("date") >= F.lit(since))
    if until is not None:
        df = df.where(F.col("date") <= F.lit(until))
    return df


def _utc_day(value: date | str | None) -> str | None:
    """'YYYY-MM-DD', the form of the `date` partition values."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value} has no time zone: partitions are UTC days, so say which instant you mean")
        return value.astimezone(timezone.utc).date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return date.fromisoformat(value).isoformat()


# --- bridge ---------------------------------------------------------------------------------------

def _read_bridge(spark: SparkSession, table: DeltaTable, location: str, struct: T.StructType,
                 since: str | None, until: str | None, only: set[str] | None = None) -> DataFrame:
    """Spark reads exactly the snapshot's files (table_files.files_to_read checks their folders);
    `only`: just these of them."""
    snapshot = files_to_read(table, location, since, until, only)
    if not snapshot.files:
        return spark.createDataFrame([], struct)
    return spark.read.schema(struct).option("basePath", snapshot.base).parquet(*snapshot.files)
