"""Delta tables in and out of Spark, with the Delta Lake JARs (native) or without them (bridge).

The bridge gives the same tables as delta-spark: delta-rs resolves the snapshot and commits,
Spark only reads and writes Parquet. A read hands Spark exactly the snapshot's files, and the
partition values Spark sees are checked against the log's (Delta keeps them in the log, not in the
files). A write commits every file Spark wrote in one Delta commit, carrying the app-transaction id
delta-spark's `txnAppId` would, so whichever path wrote a table, the other path, `deltalake` and
`analyzer.lake.read_table` read it, and a retried write is a no-op. What the driver does with the
store's files (listing, sizes, commit logs) is in table_files.py, the same for a local and an S3 lake.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analyzer.lake import Bounds, TableWriter, any_within, committed, filesystem, open_table, scan
from analyzer.schema import PARTITION_BY

from . import session
from .provisional import PROVISIONAL, files_with_provisional_rows
from .table_files import (OPEN_COST_BYTES, TRANSACTION_VERSION, commit, commit_properties, delete_staging,
                          files_that_may_hold, files_to_read, new_staging_folder, place_written_files,
                          relative_in_table, snapshot_files, spark_location)
from .types import spark_schema
from .wide_writes import FILE_FLAGS, write_tables

SAVE_MODES = ("append", "overwrite")
# A replace whose searched files hold no more bytes than opening one file costs Spark
# (table_files.OPEN_COST_BYTES: the findings table, a carried run's provisional files, a small
# lake's tables) rewrites them all: finding which of them hold a replaced row would cost a Spark
# job, and a collect, more than rewriting the rest.
REWRITTEN_WHOLE_BYTES = OPEN_COST_BYTES
# The column a write of provisional and final rows is split by (a Spark partition, not a Delta one).
SPLIT_BY_PROVISIONAL = "provisional_rows"


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


def write_delta(df: DataFrame, lake: str, name: str, schema: pa.Schema, app_id: str | None = None,
                mode: str = "append", partition_by: list[str] = PARTITION_BY, delta_mode: str = "auto") -> int:
    """Append `df` to the table, or replace its contents (`mode="overwrite"`), in one commit.

    With an `app_id` that the table has already committed, nothing is written: retried jobs stay
    idempotent. Returns a table version that includes the write (a concurrent writer may have
    committed after it)."""
    if mode not in SAVE_MODES:
        raise ValueError(f"mode must be one of {', '.join(SAVE_MODES)}, not {mode!r}")
    route = session.delta_mode(df.sparkSession, delta_mode)
    if app_id is not None and committed(lake, name, app_id):
        return open_table(lake, name).version()
    data = _schema_contract(df, spark_schema(schema))
    location = os.path.join(lake, name)
    if route == "native":
        _write_native(data, location, app_id, mode, partition_by)
    else:
        _write_bridge(data, location, schema, app_id, mode, partition_by)
    return open_table(lake, name).version()


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
    key's rows. Keys in Spark are gathered by the driver when the replace is planned."""
    keys: DataFrame | pa.Table
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
    """Does any of `matches` name each row: a replace's one rule, in the driver's rewrite and in
    Spark's tasks alike (`_Search`). A null matches no listed value, nor any key; `Match` keys in
    Arrow (`_Search` gathers Spark's)."""
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


def replace_matching(df: DataFrame, lake: str, name: str, schema: pa.Schema, matches: list[Match | Listed],
                     provisional_only: bool = False) -> int | None:
    """Delete the rows any of `matches` names and append the rows of `df`, in one commit.

    Copy-on-write, as Delta's MERGE does it: only the files holding such rows are rewritten
    (their other rows copied), the rest of the table is untouched; files too small to be worth the
    search are all rewritten (REWRITTEN_WHOLE_BYTES). Done the bridge's way (Parquet
    written from Spark's tasks, delta-rs commits) on both paths: delta-spark reads the result like
    any commit. Every table is partitioned by PARTITION_BY (the one layout of ackscope's tables).
    `provisional_only`: the caller knows every such row is a provisional one
    (provisional.py), so only the files that may hold those are searched. Returns the new table
    version, or None when there was nothing to do."""
    replaced = Replacement(df, schema, matches, provisional_only)
    return replace_all(lake, {name: replaced})[name]


@dataclass(frozen=True)
class Replacement:
    """One table's part of `replace_all`: the rows `matches` names deleted, `rows` appended (None:
    none, but for files already written: replace_all's `written`). Rows in Arrow and matches of
    keys in Arrow (`Keyed`, a Match of an Arrow table) need no Spark session where the table is
    small enough for the driver to rewrite whole (REWRITTEN_WHOLE_BYTES), nor, whatever its size,
    for `rewrite_in_driver`."""
    rows: DataFrame | pa.Table | None
    schema: pa.Schema
    matches: list[Match | Listed | Keyed]
    provisional_only: bool = False


def replace_all(lake: str, replacements: dict[str, Replacement],
                written: dict[str, list[AddAction]] | None = None) -> dict[str, int | None]:
    """`replace_matching` of several tables (by name) at once, in two Spark jobs whatever their
    number (`rewrite_all`); then each table gets its commit (a missing table is created by it).
    `written`: files of new rows already written into a table's folder (by a pass,
    wide_writes.FilesWriter), committed with its new rows. Returns each table's new version, or
    None where there was nothing to do."""
    written = written or {}
    return {name: rewrite.commit(written.get(name, [])) for name, rewrite in rewrite_all(lake, replacements).items()}


@dataclass(frozen=True)
class Rewrite:
    """One table's part of `rewrite_all`, not committed yet: the files it removes (paths relative
    to the table) and those it adds (written into the table's folder; no log names them yet)."""
    search: "_Search"
    removed: list[str]
    adds: list[AddAction]

    def commit(self, written: list[AddAction] = ()) -> int | None:
        """Removed and added in one commit, with more files already written (`written`); the new
        version, or None when there was nothing to do."""
        return self.search.commit(self.removed, [*self.adds, *written], session.commit_tag())

    def discard(self) -> None:
        """The files it wrote deleted (no log names them), the table left as it was."""
        fs, root = filesystem(self.search.location)
        for add in self.adds:
            fs.delete_file(f"{root}/{add.path}")


def rewrite_all(lake: str, replacements: dict[str, Replacement]) -> dict[str, Rewrite]:
    """`replace_all` up to its commits, in two Spark jobs whatever the number of tables: one finds
    the files holding a doomed row in every table (none when every table's are rewritten whole),
    one writes every table's kept and new rows (wide_writes.write_tables). A table with no new rows
    is the driver's where no search is needed: no file to search, or a few small ones rewritten
    whole with only literal lists to match (`Listed`), which a Spark job would cost more to plan
    and schedule than to read."""
    if not replacements:
        return {}
    searches = _searches(lake, replacements)
    in_spark = {name: search.planned() for name, search in searches.items() if not search.in_driver}
    files = [search.doomed_files(name) for name, search in in_spark.items() if search.matched and not search.whole]
    touched = {name: [] for name in searches}
    for row in (reduce(DataFrame.union, files).collect() if files else []):
        touched[row["table"]].append(row["_file"])
    adds = write_tables(lake, {name: (search.kept(sorted(touched[name])), search.replaced.schema)
                               for name, search in in_spark.items()}) if in_spark else {}
    adds.update({name: search.kept_in_driver() for name, search in searches.items() if search.in_driver})
    return {name: Rewrite(search, search.rewritten(sorted(touched[name])), adds[name])
            for name, search in searches.items()}


def rewrite_all_in_driver(lake: str, replacements: dict[str, Replacement]) -> dict[str, Rewrite] | None:
    """`rewrite_all` when the driver does every table's (no Spark session is needed); None, with
    nothing written, where a table needs Spark's search or write."""
    searches = _searches(lake, replacements)
    if not all(search.in_driver for search in searches.values()):
        return None
    return {name: Rewrite(search, search.rewritten([]), search.kept_in_driver()) for name, search in searches.items()}


def rewrite_in_driver(lake: str, name: str, replaced: Replacement) -> Rewrite:
    """One table's `rewrite_all` made by the driver, whatever the table's size: no Spark session,
    its rows and keys in Arrow (Listed, Keyed, a Match of an Arrow table). Searched files too many
    bytes to rewrite whole (REWRITTEN_WHOLE_BYTES) are searched by the driver for those holding a
    doomed row (`_Search.doomed_in_driver`), and only those are rewritten."""
    if isinstance(replaced.rows, DataFrame) or any(isinstance(match, Match) and isinstance(match.keys, DataFrame)
                                                   for match in replaced.matches):
        raise ValueError(f"{name}: the driver rewrites a table with rows and keys in Arrow, not Spark's")
    search = _searches(lake, {name: replaced})[name]
    rewritten = search.searched if search.whole else search.doomed_in_driver() if search.matched else []
    return Rewrite(search, rewritten, search.kept_in_driver(rewritten))


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


def _searches(lake: str, replacements: dict[str, Replacement]) -> dict[str, "_Search"]:
    return {name: _Search(open_table(lake, name), os.path.join(lake, name), replaced)
            for name, replaced in replacements.items()}


class _Search:
    """One table of `replace_all`: of the files searched (`searched`, paths relative to the table),
    those holding a row its matches name (`doomed`) rewritten without those rows; `whole`: every
    searched file is rewritten, with no search for those holding one; `in_driver`: by the driver
    (rewrite_all), else in Spark's tasks, with the same rule (`planned`)."""

    def __init__(self, table: DeltaTable | None, location: str, replaced: Replacement):
        self.table, self.location, self.replaced = table, location, replaced
        self.struct = spark_schema(replaced.schema)
        self.logged = snapshot_files(table) if table is not None else {}
        self.narrowed = files_with_provisional_rows(table) if table is not None and replaced.provisional_only else None
        self.searched = [path for path in self.logged if self.narrowed is None or path in self.narrowed]
        self.searched_bytes = sum(self.logged[path].size for path in self.searched)
        self.matched = bool(self.searched and replaced.matches)    # a searched file may hold a doomed row
        self.whole = self.matched and self.searched_bytes <= REWRITTEN_WHOLE_BYTES
        # No Spark job where there is nothing for one to do.
        self.in_driver = not isinstance(replaced.rows, DataFrame) and (not self.matched or self.whole and not any(
            isinstance(match, Match) and isinstance(match.keys, DataFrame) for match in replaced.matches))
        self.shipped = None

    @property
    def spark(self) -> SparkSession:
        rows = self.replaced.rows
        return rows.sparkSession if isinstance(rows, DataFrame) else SparkSession.active()

    def planned(self) -> "_Search":
        """Itself, its matches shipped to Spark's tasks (a table not `in_driver`): the keys of a
        Match in Spark gathered in the driver (a Spark job each), all broadcast."""
        if self.matched:
            matches = [Match(match.keys.select(*match.on, *(match.at_least or ())[1:]).toArrow(), match.on,
                             match.at_least)
                       if isinstance(match, Match) and isinstance(match.keys, DataFrame) else match
                       for match in self.replaced.matches]
            self.shipped = self.spark.sparkContext.broadcast(matches)
        return self

    def _read(self, only: set[str] | None, columns: list[str] | None = None) -> DataFrame:
        current = _read_bridge(self.spark, self.table, self.location, self.struct, None, None, only)
        return current if columns is None else current.select(*columns, F.col("_metadata.file_path").alias("_file"))

    def doomed_files(self, name: str) -> DataFrame:
        """The files holding a doomed row (Spark names files by URI; the Delta log by path
        relative to the table), with the table's name: only the columns the matches read are read."""
        keys = [_as_keys(match) for match in self.replaced.matches if not isinstance(match, Listed)]
        columns = sorted({*(column for match in self.replaced.matches if isinstance(match, Listed)
                            for column in match.values),
                          *(column for match in keys for column in (*match.on, *(match.at_least or ())[:1]))})
        shipped = self.shipped

        def files(batches):
            for batch in batches:
                yield batch.filter(doomed(batch, shipped.value)).select(["_file"])

        return (self._read(self.narrowed, columns).mapInArrow(files, "_file string")
                .select(F.lit(name).alias("table"), "_file").distinct())

    def rewritten(self, touched: list[str]) -> list[str]:
        """The files to rewrite (relative paths), of those found holding a doomed row (URIs)."""
        if self.whole:
            return self.searched
        base = spark_location(self.location)
        return [relative_in_table(uri, base) for uri in touched]

    def kept(self, touched: list[str]) -> DataFrame:
        """The rows the rewritten files keep, and the new rows."""
        rows = self.replaced.rows
        if isinstance(rows, pa.Table):
            rows = self.spark.createDataFrame(rows.select(self.struct.names), self.struct)
        new = [] if rows is None else [_schema_contract(rows, self.struct)]
        if self.whole or touched:
            shipped = self.shipped

            def keep(batches):
                for batch in batches:
                    yield batch.filter(pc.invert(doomed(batch, shipped.value)))

            current = self._read(self.narrowed if self.whole else set(self.rewritten(touched)))
            kept = current.mapInArrow(keep, current.schema).select(*self.struct.names)
        else:
            kept = self.spark.createDataFrame([], self.struct)
        return reduce(DataFrame.unionByName, [kept, *new])

    def kept_in_driver(self, rewritten: list[str] | None = None) -> list[AddAction]:
        """The rows the `rewritten` files keep (paths relative to the table; None: every searched
        file where `whole`, else none), and the new rows, written as files (as wide_writes'
        writers split them by flags) into the table's folder; their add actions."""
        if rewritten is None:
            rewritten = self.searched if self.whole else []
        flags = tuple(flag for flag in FILE_FLAGS if flag in self.replaced.schema.names)
        writer = TableWriter(os.path.dirname(self.location), os.path.basename(self.location), self.replaced.schema,
                             split_by=flags)
        rows = []
        for path in rewritten:
            current = writer.read_file(path, self.logged[path].partition_values.get("date"))
            rows.append(current.filter(pc.invert(doomed(current, self.replaced.matches))))
        if self.replaced.rows is not None:
            rows.append(self.replaced.rows.select(self.replaced.schema.names).cast(self.replaced.schema))
        if rows:
            writer.write(pa.concat_tables(rows))
        return writer.actions

    def doomed_in_driver(self) -> list[str]:
        """The searched files holding a doomed row (paths relative to the table), found by the
        driver with the one rule (`doomed`): only the columns the matches read, file by file,
        streamed (lake.scan), a file or row group whose statistics say it holds none of the values
        matched left unread."""
        keys = [_as_keys(match) for match in self.replaced.matches if not isinstance(match, Listed)]
        columns = sorted({*(column for match in self.replaced.matches if isinstance(match, Listed)
                            for column in match.values),
                          *(column for match in keys for column in (*match.on, *(match.at_least or ())[:1]))})
        touched: list[str] = []
        for path, batch in scan(os.path.dirname(self.location), os.path.basename(self.location),
                                self.replaced.schema, columns, version=self.table.version(), files=set(self.searched),
                                bounded=tuple(columns), may_hold=_may_match(self.replaced.matches)):
            if (not touched or touched[-1] != path) and pc.any(doomed(batch, self.replaced.matches)).as_py():
                touched.append(path)
        return touched

    def commit(self, rewritten: list[str], adds: list[AddAction], tag: str | None) -> int | None:
        if self.table is None:
            commit(self.location, self.replaced.schema, adds, PARTITION_BY, tag=tag)
            return self._version()
        if not adds and not rewritten:
            return None
        now = int(time.time() * 1000)
        removes = [RemoveAction(path, True, now, self.logged[path].size, self.logged[path].partition_values)
                   for path in rewritten]
        # A concurrent writer removing one of these files makes this commit fail rather than lose its rows.
        self.table.create_write_transaction([*removes, *adds], mode="append", schema=self.replaced.schema,
                                            partition_by=PARTITION_BY, commit_properties=commit_properties(tag))
        return self._version()

    def _version(self) -> int:
        return open_table(os.path.dirname(self.location), os.path.basename(self.location)).version()


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


def _write_bridge(data: DataFrame, path: str, schema: pa.Schema, app_id: str | None, mode: str,
                  partition_by: list[str]) -> None:
    """Spark writes Parquet; its files are placed in the table and committed together (table_files.py).

    Until the commit, nothing in the log names them, so no reader sees a partial write."""
    # "overwrite" removes every file of the snapshot in this same commit.
    commit(path, schema, _write_parquet(data, path, partition_by), partition_by, app_id, mode,
           tag=session.commit_tag())


def _write_parquet(data: DataFrame, location: str, partition_by: list[str]) -> list[AddAction]:
    """Spark writes `data` to a staging folder of the table at `location`; the files, placed in the
    table's partition folders, as add actions. Provisional rows (provisional.py) go to files of
    their own: Spark splits the write by the flag as by a partition, one folder level below."""
    staging = new_staging_folder()
    split = SPLIT_BY_PROVISIONAL if PROVISIONAL in data.columns else None
    if split:
        data = data.withColumn(split, F.col(PROVISIONAL))
    try:
        (data.write.partitionBy(*partition_by, *([split] if split else [])).option("compression", "zstd")
         .parquet(f"{spark_location(location)}/{staging}"))
        return place_written_files(location, staging, partition_by, split, stats_of=(PROVISIONAL,) if split else ())
    finally:
        delete_staging(location, staging)


# --- native ---------------------------------------------------------------------------------------

def _write_native(data: DataFrame, path: str, app_id: str | None, mode: str, partition_by: list[str]) -> None:
    writer = data.write.format("delta").mode(mode).partitionBy(*partition_by)
    if mode == "overwrite":
        # Replacing a table written by an older ackscope (without `provisional`) replaces its schema too.
        writer = writer.option("overwriteSchema", "true")
    if app_id is not None:
        # delta-spark skips a write whose app id the table already has at this version.
        writer = writer.option("txnAppId", app_id).option("txnVersion", TRANSACTION_VERSION)
    writer.save(spark_location(path))
