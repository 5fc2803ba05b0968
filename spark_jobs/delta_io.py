"""Delta tables into Spark, natively (the Delta Lake JARs) or by the delta-rs bridge (Spark reads the
snapshot's Parquet files: table_files.py), and the driver's copy-on-write rewrites of the analysis
tables (docs/analysis.md, "Spark and Delta"; "Incremental": Only the provisional rows' files are
rewritten). The tables are written with delta-rs only, so every reader sees the same tables.
"""

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import reduce
from itertools import groupby
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analyzer.lake import Bounds, TableFile, TableWriter, any_within, filesystem, open_table, scan, table_files
from analyzer.schema import PARTITION_BY

from . import session
from .provisional import PROVISIONAL
from .table_files import OPEN_COST_BYTES, commit, files_that_may_hold, files_to_read, spark_location
from .types import spark_schema
from .wide_writes import FilesWriter, add_actions

# Searched files of no more bytes than opening one costs (table_files.OPEN_COST_BYTES) are all
# rewritten, unsearched: cheap for the driver, and every later read is spared the small files.
REWRITTEN_WHOLE_BYTES = OPEN_COST_BYTES


def read_delta(spark: SparkSession, lake: str, name: str, schema: pa.Schema, mode: str = "auto",
               since: str | None = None, version: int | None = None) -> DataFrame:
    """The table's snapshot (at `version`, by default the current one) in `schema`, its `date`
    partitions from the UTC day `since` ('YYYY-MM-DD') on; a missing table reads as empty. `mode`:
    the Delta path (session.delta_mode)."""
    table = open_table(lake, name)
    struct = spark_schema(schema)
    route = session.delta_mode(spark, mode)
    if table is None:
        return spark.createDataFrame([], struct)
    if version is not None:
        table.load_as_version(version)
    if since is not None and "date" not in table.metadata().partition_columns:
        raise ValueError(f"table {name!r} is not partitioned by date: since cannot select its days")
    location = os.path.join(lake, name)
    if route == "native":
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        data = reader.load(spark_location(location))
        if since is not None:
            data = data.where(F.col("date") >= F.lit(since))
    else:
        snapshot = files_to_read(table, location, since, None)
        if not snapshot.files:
            return spark.createDataFrame([], struct)
        data = spark.read.schema(struct).option("basePath", snapshot.base).parquet(*snapshot.files)
    types = {field.name: field.dataType for field in data.schema}
    missing = [field.name for field in struct if field.name not in types]
    if missing:
        raise ValueError(f"the DataFrame lacks the table's columns {missing}")
    # The schema's columns in its order; a cast is several JVM round trips per column: only where the type differs.
    return data.select(*[field.name if types[field.name] == field.dataType
                         else F.col(field.name).cast(field.dataType).alias(field.name) for field in struct])


def read_files(spark: SparkSession, lake: str, name: str, files: tuple[str, ...], columns: list[str]) -> DataFrame:
    """Data columns (no partition columns) of exactly these Parquet files of a table."""
    table_schema = pa.schema(DeltaTable(os.path.join(lake, name)).schema().to_arrow())
    struct = spark_schema(pa.schema([table_schema.field(c) for c in columns]))
    if not files:
        return spark.createDataFrame([], struct)
    return spark.read.schema(struct).parquet(*files)


@dataclass(frozen=True)
class Match:
    """Rows equal to one of `keys` on the columns `on` (their types cast to the rows'); with
    `at_least` (column, key column), only those whose column is at least the smallest key column
    of their key's rows."""
    keys: pa.Table
    on: tuple[str, ...]
    at_least: tuple[str, str] | None = None


@dataclass(frozen=True)
class Listed:
    """Rows whose every column named holds one of its listed values."""
    values: dict[str, tuple]


def connections_match(keys: list[str], **also: tuple) -> Listed:
    """The rows of these connections (and, per column of `also`, one of its values)."""
    return Listed({"connection_id": tuple(keys), **also})


def doomed(rows: pa.Table | pa.RecordBatch, matches: list[Match | Listed]) -> pa.Array:
    """Does any of `matches` name each row: a replace's one rule. A null matches nothing."""
    hit = pa.repeat(pa.scalar(False), rows.num_rows)
    for match in matches:
        if isinstance(match, Listed):
            named = reduce(pc.and_, [pc.is_in(rows[column], value_set=pa.array(list(values), rows[column].type))
                                     for column, values in match.values.items()])
        else:
            named = _keyed(rows, match)
        hit = pc.or_(hit, pc.fill_null(named, False))
    return hit


def _keyed(rows: pa.Table | pa.RecordBatch, match: Match) -> pa.Array:
    """Which rows a Match names: a hash join of their key columns with the keys."""
    on = list(match.on)
    position = pa.array(range(rows.num_rows), pa.int64())
    mine = {column: rows[column] for column in on}
    keys = {column: match.keys[column].cast(rows[column].type) for column in on}
    smallest = []
    if match.at_least:
        mine["_at"], keys["_from"] = rows[match.at_least[0]], match.keys[match.at_least[1]]
        smallest = [("_from", "min")]
    keys = pa.table(keys).group_by(on, use_threads=False).aggregate(smallest)
    joined = pa.table({**mine, "_row": position}).join(keys, keys=on, join_type="inner", use_threads=False)
    if match.at_least:
        joined = joined.filter(pc.greater_equal(joined["_at"], joined["_from_min"]))
    return pc.is_in(position, value_set=joined["_row"].combine_chunks())


@dataclass(frozen=True)
class Replacement:
    """One table's part of `replace_all`: the rows `matches` names deleted, `rows` appended (None:
    none but files already written). `provisional_only`: every such row is a provisional one, so
    only the files that may hold those are searched."""
    rows: pa.Table | None
    schema: pa.Schema
    matches: list[Match | Listed]
    provisional_only: bool = False


def replace_all(lake: str, replacements: dict[str, Replacement],
                written: dict[str, list[AddAction]] | None = None) -> dict[str, int | None]:
    """Each table's Replacement made and committed, with the files of new rows already written into
    its folder (`written`: a pass's); each table's new version, None where there was nothing to do."""
    written = written or {}
    return {name: rewrite.commit(written.get(name, [])) for name, rewrite in rewrite_all(lake, replacements).items()}


@dataclass(frozen=True)
class Rewrite:
    """One table's Replacement made, not committed yet: the files it removes (paths relative to the
    table) and those it adds (written into the table's folder; no log names them yet)."""
    table: DeltaTable | None
    lake: str
    name: str
    schema: pa.Schema
    removed: dict[str, TableFile]
    adds: list[AddAction]

    def commit(self, written: list[AddAction] = ()) -> int | None:
        """Removed and added, with the files `written`, in one commit (a missing table is created by
        it); the new version, or None when there was nothing to do."""
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
    return {name: rewrite(lake, name, replaced) for name, replaced in replacements.items()}


def rewrite(lake: str, name: str, replaced: Replacement) -> Rewrite:
    """Copy-on-write, as Delta's MERGE does it, by the driver: each searched file holding a doomed
    row rewritten without it, and the new rows written; the rest of the table untouched."""
    table = open_table(lake, name)
    searched = table_files(table) if table is not None else {}
    if table is not None and replaced.provisional_only:
        provisional = files_that_may_hold(table, PROVISIONAL)
        searched = {path: file for path, file in searched.items() if path in provisional}
    files = FilesWriter(lake, name, replaced.schema)
    removed = {}
    if searched and replaced.matches:
        for path, rows, hit in _doomed_files(table, replaced, searched, files.writer):
            removed[path] = searched[path]
            files.add(rows.filter(pc.invert(hit)))
    if replaced.rows is not None and replaced.rows.num_rows:
        files.add(replaced.rows.select(replaced.schema.names))
    return Rewrite(table, lake, name, replaced.schema, removed, add_actions(files.files().to_pylist()).get(name, []))


def _doomed_files(table: DeltaTable, replaced: Replacement, searched: dict[str, TableFile],
                  writer: TableWriter) -> Iterator[tuple[str, pa.Table, pa.Array]]:
    """Each searched file (all, if they hold REWRITTEN_WHOLE_BYTES at most) or each holding a doomed
    row, read whole: its path, its rows and which of them are doomed. Those holding one are found by
    streaming the columns the matches read (lake.scan: files and row groups whose statistics rule
    them out unread). A pass's file holds the connections of one hash, over the whole range of ids,
    so most files' bounds take in a key they do not hold: reading only the matched columns to find
    out took 0.2-0.3 s against 1.6-3.8 s for every column (20 files of 28 MB)."""
    matches = replaced.matches
    paths = iter(searched)
    if sum(file.size for file in searched.values()) > REWRITTEN_WHOLE_BYTES:
        columns = sorted({column for match in matches for column in _read_by(match)})
        lake, name = os.path.split(writer.path)
        batches = scan(lake, name, replaced.schema, columns, version=table.version(), files=set(searched),
                       bounded=tuple(columns), may_hold=_may_match(matches))
        paths = (path for path, read in groupby(batches, key=itemgetter(0))
                 if any(pc.any(doomed(batch, matches)).as_py() for _, batch in read))
    for path in paths:
        rows = writer.read_file(path, searched[path].partition_values.get("date"))
        yield path, rows, doomed(rows, matches)


def _read_by(match: Match | Listed) -> tuple[str, ...]:
    if isinstance(match, Listed):
        return tuple(match.values)
    return (*match.on, *(match.at_least[:1] if match.at_least else ()))


def _may_match(matches: list[Match | Listed]) -> Callable[[Bounds], bool]:
    """lake.scan's `may_hold`: not where, for each match, some column it names has none of its
    values within its bounds (a Match's `at_least` only narrows: not tested)."""
    named = []
    for match in matches:
        values = match.values if isinstance(match, Listed) else {c: match.keys[c].to_pylist() for c in match.on}
        named.append({column: sorted(v for v in set(listed) if v is not None) for column, listed in values.items()})
    return lambda bounds: any(all(any_within(listed, bounds.get(column)) for column, listed in columns.items())
                              for columns in named)
