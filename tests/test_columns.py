"""The connection pass's Arrow conversions in C (analyzer/_columns.c, analyzer/columns.py) against
pyarrow's own, which stay the reference.

Rows in: every batch gives the same rows both ways (Rows from C, equal to the dicts, and a Row
behaves as a read-only dict), value for value and type for type (True == 1
in Python, so equality alone would miss a bool read as an int): the frames of the bundled examples
and of the bench generator, sliced at odd offsets, with their strings as large strings too, and
random columns of every kind the C loop reads. Records out: the four timeline tables of the same
frames come out identical, and random field values, including those the C loop must decline
(out-of-range ints, bools among ints, surrogates, floats), give the same array or the same error;
records appended as they come (RecordColumns, RecordTables) give the same tables, each record
taken whole or declined whole where record_column would decline one of its fields.
Buffers shorter than their column claims are refused with ValueError, never read past. And the
whole connection pass gives the same output with every C part (these, and records.py's makers)
and with none (ACKSCOPE_PURE_PYTHON=1).

Under CI=true the module must be built: a machine where it does not compile fails here, loudly,
instead of testing the Python path twice.
"""

import copy
import gc
import glob
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import columns
from analyzer.connection_analysis import ANALYSIS_COLUMNS
from analyzer.ingest import decode
from analyzer.timeline import records as r
from analyzer.timeline.connection import replay
from analyzer.detectors.messages import came_back
from analyzer.timeline.tables import INPUT_COLUMNS, SORT_KEYS, RecordTables, to_tables

from .conftest import ROOT, check_built, needs_built

MISSING = "analyzer/_columns.c is not built (pip install -e . compiles it)"


@pytest.mark.c_twin
def test_the_module_is_built_in_ci():
    check_built(columns.available(), MISSING)


needs_module = needs_built(columns.available(), MISSING)


def _typed(rows) -> list:
    return [[(name, type(value), value) for name, value in row.items()] for row in rows]


def assert_rows_both_ways(batch: pa.RecordBatch, monkeypatch) -> None:
    assert columns.available(), MISSING
    monkeypatch.delenv("ACKSCOPE_PURE_PYTHON", raising=False)
    fast = columns.batch_rows(batch)
    assert isinstance(fast, list), "the C loop did not take the batch"
    expected = batch.to_pylist()
    assert _typed(fast) == _typed(expected)
    assert _typed(columns.python_batch_rows(batch)) == _typed(expected)


def _example_frames() -> pa.Table:
    batches = []
    for path in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng"))):
        decode(path, batches.append)
    frames = pa.concat_tables(batches).select(list(ANALYSIS_COLUMNS))  # what the pass reads
    return frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")])


@pytest.fixture(scope="module")
def example_frames() -> pa.Table:
    return _example_frames()


@pytest.fixture(scope="module")
def generated_frames() -> pa.Table:
    spec = importlib.util.spec_from_file_location("bench_frames_generator",
                                                  os.path.join(ROOT, "bench", "frames_generator.py"))
    gen = sys.modules.setdefault("bench_frames_generator", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(gen)
    params = gen.Params(frames=20_000, hot_deliveries=3_000, seed=5, connections=6, duration_s=600)
    tables = []
    for item in gen.generate(params):
        if isinstance(item, dict):
            break
        tables += [t.select(list(ANALYSIS_COLUMNS)) for t in item[0].tables()]
    return pa.concat_tables(tables)


@needs_module
def test_example_frames_give_the_same_rows(example_frames, monkeypatch):
    assert example_frames.num_rows > 1000
    for batch in example_frames.to_batches(max_chunksize=777):
        assert_rows_both_ways(batch, monkeypatch)


@needs_module
def test_sliced_batches_and_large_strings_give_the_same_rows(generated_frames, monkeypatch):
    table = generated_frames.combine_chunks()
    large = pa.schema([pa.field(f.name, pa.large_string()) if pa.types.is_string(f.type) else f
                       for f in table.schema])
    for source in (table, table.cast(large)):
        batch = source.to_batches()[0]
        for start, length in ((0, 10_000), (3, 5_001), (9_997, 2), (17, 0), (batch.num_rows - 5, 5)):
            assert_rows_both_ways(batch.slice(start, length), monkeypatch)


@needs_module
def test_a_batch_with_a_type_it_does_not_read_goes_to_pyarrow(monkeypatch):
    batch = pa.record_batch({"seq": [1, 2], "ratio": [0.5, None], "ts": pa.array([1, 2], pa.timestamp("us"))})
    rows = columns.batch_rows(batch)
    assert not isinstance(rows, list)  # the reference path's lazy map
    assert _typed(rows) == _typed(batch.to_pylist())


@needs_module
def test_a_table_is_read_like_its_batches(example_frames, monkeypatch):
    one_chunk = example_frames.slice(5, 300).combine_chunks()
    rows = columns.batch_rows(one_chunk)
    assert isinstance(rows, list) and _typed(rows) == _typed(one_chunk.to_pylist())
    chunks = pa.concat_tables([one_chunk.slice(0, 7), one_chunk.slice(7)])
    assert _typed(columns.batch_rows(chunks)) == _typed(one_chunk.to_pylist())
    assert list(columns.batch_rows(one_chunk.slice(0, 0).combine_chunks())) == []


@needs_module
def test_a_batch_with_a_name_twice_goes_to_pyarrow():
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), pa.array([None, 3])], names=["seq", "seq"])
    rows = columns.batch_rows(batch)
    assert not isinstance(rows, list)
    assert list(rows) == [{"seq": None}, {"seq": 3}] == list(columns.python_batch_rows(batch))


@needs_module
def test_a_row_is_a_read_only_mapping_equal_to_its_dict():
    """What the rules may do with a frame row, a Row does as the dict `to_pylist` gives (every
    column a key, a null None), or refuses as a read-only mapping must; and it stays out of the
    cyclic collector, holding only plain values."""
    batch = pa.record_batch({"seq": [7, None], "method": ["basic.ack", None], "multiple": [True, None]})
    row, empty = columns.batch_rows(batch)
    expected = {"seq": 7, "method": "basic.ack", "multiple": True}
    assert type(row) is columns._columns.Row and isinstance(row, Mapping)
    assert row == expected and expected == row and not row != expected and row != {**expected, "seq": 8}
    assert row != {"seq": 7} and row == columns.batch_rows(batch)[0] and row != empty
    assert empty == {"seq": None, "method": None, "multiple": None}
    assert row["method"] == "basic.ack" and empty["method"] is None and row.get("nope", 5) == 5
    assert row.get("nope") is None and row.get("seq") == 7 and empty.get("seq", 5) is None
    assert "seq" in row and "seq" in empty and "nope" not in row and len(row) == 3
    assert list(row) == list(row.keys()) == ["seq", "method", "multiple"]
    assert row.items() == list(expected.items()) and row.values() == list(expected.values())
    assert dict(row) == {**row} == row.copy() == copy.copy(row) == copy.deepcopy(row) == expected
    assert type(copy.deepcopy(row)) is dict
    assert repr(row) == f"Row({expected!r})"
    with pytest.raises(KeyError):
        row["nope"]
    with pytest.raises(TypeError):
        row["seq"] = 8
    with pytest.raises(TypeError):
        hash(row)
    with pytest.raises(TypeError):
        type(row)()
    assert not gc.is_tracked(row)


def test_pure_python_switch_turns_it_off(example_frames, monkeypatch):
    monkeypatch.setenv("ACKSCOPE_PURE_PYTHON", "1")
    batch = example_frames.to_batches(max_chunksize=100)[0]
    rows = columns.batch_rows(batch)
    assert not isinstance(rows, list)
    assert _typed(rows) == _typed(batch.to_pylist())


KINDS = {
    pa.int64(): st.integers(-2**63, 2**63 - 1), pa.int32(): st.integers(-2**31, 2**31 - 1),
    pa.int16(): st.integers(-2**15, 2**15 - 1), pa.int8(): st.integers(-128, 127), pa.bool_(): st.booleans(),
    pa.string(): st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    pa.large_string(): st.text(max_size=5),
    pa.binary(): st.binary(max_size=12), pa.large_binary(): st.binary(max_size=5),
}


@st.composite
def random_batches(draw):
    n = draw(st.integers(0, 40))
    chosen = draw(st.lists(st.sampled_from(list(KINDS) + [pa.null()]), min_size=1, max_size=8))
    data = {}
    for k, arrow_type in enumerate(chosen):
        if arrow_type == pa.null():
            data[f"c{k}"] = pa.nulls(n)
        else:
            values = draw(st.lists(st.none() | KINDS[arrow_type], min_size=n, max_size=n))
            data[f"c{k}"] = pa.array(values, type=arrow_type)
    batch = pa.record_batch(data)
    start = draw(st.integers(0, n))
    return batch.slice(start, draw(st.integers(0, n - start)))


@needs_module
@settings(max_examples=300, deadline=None)
@given(random_batches())
def test_random_columns_give_the_same_rows(batch):
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert_rows_both_ways(batch, monkeypatch)


@needs_module
def test_short_buffers_are_refused_not_read():
    from analyzer import _columns
    column = pa.array([1, 2, 3], pa.int64())
    validity, data = column.buffers()
    with pytest.raises(ValueError, match="data buffer holds 24 bytes, the column needs 32"):
        _columns.rows(("seq",), ((_columns.INT64, 1, validity, data, None),), 3)
    text = pa.array(["ab", "cd"])
    _, offsets, chars = text.buffers()
    with pytest.raises(ValueError, match="offsets buffer"):
        _columns.rows(("s",), ((_columns.UTF8, 0, None, chars, offsets),), 3)
    forged = pa.py_buffer(pa.array([0, 2, 99], pa.int32()).buffers()[1])  # an end past the characters
    with pytest.raises(ValueError, match="outside a data buffer of 4 bytes"):
        _columns.rows(("s",), ((_columns.UTF8, 0, None, chars, forged),), 2)
    with pytest.raises(ValueError, match="unknown column kind"):
        _columns.rows(("s",), ((99, 0, None, chars, offsets),), 2)


# -- records out -----------------------------------------------------------------------------------

def _tables_both_ways(records: list, monkeypatch) -> tuple[dict, dict]:
    monkeypatch.delenv("ACKSCOPE_PURE_PYTHON", raising=False)
    fast = to_tables(records)
    monkeypatch.setenv("ACKSCOPE_PURE_PYTHON", "1")
    return fast, to_tables(records)


@needs_module
@pytest.mark.parametrize("source", ["example_frames", "generated_frames"])
def test_timeline_tables_are_identical(source, request, monkeypatch):
    frames = request.getfixturevalue(source).select(list(INPUT_COLUMNS))
    records = replay(frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist())
    taken = []
    real = columns._columns.record_column
    monkeypatch.setattr(columns._columns, "record_column", lambda *args: taken.append(real(*args)) or taken[-1],
                        raising=False)
    fast, general = _tables_both_ways(records, monkeypatch)
    assert {name: t.num_rows for name, t in fast.items()} == {name: t.num_rows for name, t in general.items()}
    assert fast["deliveries"].num_rows > 0 and fast["publishes"].num_rows > 0
    for name in fast:
        assert fast[name].equals(general[name], check_metadata=True), name
    assert taken and all(x is not None for x in taken), "the C loop declined a record field"


@dataclass(frozen=True, slots=True)
class Item:
    number: object
    small: object
    flag: object
    text: object


FIELD_TYPES = {"number": pa.int64(), "small": pa.int32(), "flag": pa.bool_(), "text": pa.string()}
ANY_VALUE = (st.none() | st.integers(-2**64, 2**64) | st.booleans() | st.floats(allow_nan=False)
             | st.text(max_size=6))


def _general(items: list, name: str, arrow_type: pa.DataType):
    try:
        return pa.array([getattr(x, name) for x in items], type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
        return type(error)


def assert_fields_as_pyarrow(values: list, must_take: bool) -> None:
    """Each field of Items made of `values` as record_column gives it, if it takes it (it must,
    with `must_take`, unless there are none), equal to pyarrow's own conversion of it."""
    items = [Item(*v) for v in values]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("ACKSCOPE_PURE_PYTHON", raising=False)
        for name, arrow_type in FIELD_TYPES.items():
            fast = columns.record_column(items, name, arrow_type)
            if must_take:
                assert (fast is None) == (not items), name
            if fast is not None:
                expected = _general(items, name, arrow_type)
                assert isinstance(expected, pa.Array), (name, expected)
                fast.validate(full=True)
                assert fast.equals(expected) and fast.null_count == expected.null_count, name


@needs_module
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE), max_size=30))
def test_record_fields_give_the_same_array_or_are_declined(values):
    assert_fields_as_pyarrow(values, must_take=False)


TYPED_VALUES = st.tuples(st.none() | st.integers(-2**63, 2**63 - 1), st.none() | st.integers(-2**31, 2**31 - 1),
                         st.none() | st.booleans(), st.none() | st.text(max_size=8))


@needs_module
@settings(max_examples=300, deadline=None)
@given(st.lists(TYPED_VALUES, max_size=40))
def test_record_fields_of_their_own_types_are_taken(values):
    assert_fields_as_pyarrow(values, must_take=True)


@needs_module
def test_record_fields_it_must_decline():
    text = Item(None, None, None, "\ud800")          # a surrogate: not UTF-8
    assert columns.record_column([text], "text", pa.string()) is None
    assert columns.record_column([Item(None, 2**31, None, None)], "small", pa.int32()) is None
    assert columns.record_column([Item(True, None, None, None)], "number", pa.int64()) is None  # a bool, not an int
    assert columns.record_column([Item(None, None, 1, None)], "flag", pa.bool_()) is None
    assert columns.record_column([Item(1.0, None, None, None)], "number", pa.int64()) is None
    mixed = [Item(1, None, None, None), r.Violation(*([None] * 16))]  # not all of the slot's class
    assert columns.record_column(mixed, "number", pa.int64()) is None
    assert columns.record_column([Item(1, 2, True, "x")], "number", pa.float64()) is None  # a type it does not write
    full = columns.record_column([Item(2**63 - 1, -2**31, False, "é"), Item(None, None, None, None)], "number",
                                 pa.int64())
    assert full.to_pylist() == [2**63 - 1, None]


# -- records out as they come (RecordColumns, RecordTables) -----------------------------------------

def _record_tables(records: list, monkeypatch, pure: bool, takes: int = 1) -> tuple[list[dict], int]:
    """`records` appended to a RecordTables (C, or the reference with `pure`), taken `takes` times
    along the way: the tables of each take, and the deliveries came_back counted in all."""
    if pure:
        monkeypatch.setenv("ACKSCOPE_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("ACKSCOPE_PURE_PYTHON", raising=False)
    gathered = RecordTables(r.Delivery, came_back)
    assert (gathered.builder is None) == pure
    out, count, step = [], 0, max(1, len(records) // takes)
    for start in range(0, len(records), step):
        for record in records[start:start + step]:
            gathered.append(record)
        assert len(gathered) == len(records[start:start + step])
        tables, counted = gathered.take()
        out.append(tables)
        count += counted
    assert len(gathered) == 0
    return out, count


@needs_module
@pytest.mark.parametrize("source", ["example_frames", "generated_frames"])
def test_records_appended_as_they_come_give_the_tables_of_the_records(source, request, monkeypatch):
    frames = request.getfixturevalue(source).select(list(INPUT_COLUMNS))
    records = replay(frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist())
    reference = to_tables(records)
    assert reference["deliveries"].num_rows > 0 and reference["publishes"].num_rows > 0
    expected_count = sum(came_back(x) for x in records if type(x) is r.Delivery)
    for pure, takes in ((True, 1), (False, 1), (False, 7)):
        pieces, count = _record_tables(records, monkeypatch, pure, takes)
        assert count == expected_count, (pure, takes)
        for name, table in reference.items():
            whole = pa.concat_tables([piece[name] for piece in pieces]).sort_by(
                [(column, "ascending") for column in SORT_KEYS[name]])
            whole.validate(full=True)
            assert whole.equals(table, check_metadata=True), (name, pure, takes)


ITEM_LAYOUT = {Item: [pa.field(name, arrow_type) for name, arrow_type in FIELD_TYPES.items()]}


def assert_appended_as_record_column_takes(batches: list[list[tuple]]) -> None:
    """Items of `values` appended to one RecordColumns, taken after each batch: each item is taken
    whole when record_column takes every field of it alone, else kept whole among the declined
    (nothing of it left in the columns, whichever field declined it), and the columns equal pyarrow's
    of the items taken; the builder's buffers are reused from one take to the next."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.delenv("ACKSCOPE_PURE_PYTHON", raising=False)
        builder = columns.record_columns(ITEM_LAYOUT, Item, lambda item: item.flag is True)
        for values in batches:
            items = [Item(*v) for v in values]
            for item in items:
                builder.append(item)
            (([rows, buffers],), declined, count) = builder.take()
            alone = [all(columns.record_column([x], name, t) is not None for name, t in FIELD_TYPES.items())
                     for x in items]
            taken = [x for x, ok in zip(items, alone) if ok]
            expected_declined = [x for x, ok in zip(items, alone) if not ok]
            assert declined == expected_declined
            assert [type(x) for x in declined] == [Item] * len(declined)
            assert all(d is x for d, x in zip(declined, expected_declined))
            assert count == sum(x.flag is True for x in items)
            assert rows == len(taken)
            for (name, arrow_type), column in zip(FIELD_TYPES.items(), buffers):
                built = columns.taken_array(arrow_type, rows, column)
                built.validate(full=True)
                expected = pa.array([getattr(x, name) for x in taken], type=arrow_type)
                assert built.equals(expected) and built.null_count == expected.null_count, name


@needs_module
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE), max_size=30), max_size=3))
def test_appended_records_are_taken_whole_or_declined_whole(batches):
    assert_appended_as_record_column_takes(batches)


@needs_module
def test_appended_records_across_many_rows_and_takes():
    """Past the builder's steps of 1,024 rows and its bytes of 8 bits, with declines among them,
    over takes of different sizes."""
    import random
    rng = random.Random(46)
    pool = [(None, None, None, None), (2**63 - 1, -2**31, True, "é"), (-5, 7, False, ""), (3, 2**31, True, "x"),
            (1, 2, None, "\ud800"), (True, 1, False, "y"), (7, None, 1, None), (2**64, 0, True, "z" * 300),
            (12, 34, False, "ascii")]
    batches = [[rng.choice(pool) for _ in range(n)] for n in (3000, 1, 0, 1024, 2049)]
    assert_appended_as_record_column_takes(batches)


@needs_module
def test_a_taken_record_is_not_kept_and_a_declined_one_is():
    builder = columns.record_columns(ITEM_LAYOUT)
    taken, declined = Item(1, 2, True, "kept nowhere"), Item(1.5, None, None, None)
    before = sys.getrefcount(taken), sys.getrefcount(declined)
    builder.append(taken)
    builder.append(declined)
    assert (sys.getrefcount(taken), sys.getrefcount(declined)) == (before[0], before[1] + 1)
    assert len(builder) == 2
    builder.append("not an Item at all")
    (([rows, _],), kept, count) = builder.take()
    assert (rows, kept, count) == (1, [declined, "not an Item at all"], 0)
    assert len(builder) == 0


@needs_module
def test_a_layout_must_name_slots_of_its_class():
    @dataclass(frozen=True, slots=True)
    class Other:
        number: object
    with pytest.raises(TypeError, match="__slots__"):
        columns._columns.RecordColumns(((Item, ((Other.__dict__["number"], columns._columns.INT64),)),))
    assert columns.record_columns({Item: [pa.field("number", pa.float64())]}) is None  # a type it does not write
    assert columns.record_columns({Item: [pa.field("missing", pa.int64())]}) is None


@needs_module
def test_spark_hands_the_pass_batches_the_c_loop_takes(spark, example_frames, tmp_path):
    """The pass's input as Spark's Python workers receive it (mapInArrow), not just as pyarrow
    builds it here: every batch must be one the C loop reads, or the pass silently runs the slow path."""
    import pyarrow.parquet as pq

    path = str(tmp_path / "frames.parquet")
    pq.write_table(example_frames, path)

    def probe(batches):
        for batch in batches:
            taken = columns.enabled() and columns._row_columns(batch) is not None
            yield pa.record_batch({"taken": [taken], "rows": [batch.num_rows],
                                   "types": [",".join(sorted({str(t) for t in batch.schema.types}))]})

    seen = spark.read.parquet(path).mapInArrow(probe, "taken boolean, rows long, types string").collect()
    assert sum(row["rows"] for row in seen) == example_frames.num_rows
    assert all(row["taken"] for row in seen), {row["types"] for row in seen}


@needs_module
@pytest.mark.parametrize("shape", [["--frames", "30000", "--hot-deliveries", "6000", "--seed", "7"],
                                   ["--frames", "20000", "--hot-deliveries", "2000", "--seed", "11", "--quiet"]])
def test_the_pass_gives_the_same_output_with_and_without_its_c_parts(shape):
    """Every output of the connection pass (bench/pass_cpu.py's digest of the timeline tables,
    channel_metrics, raw findings and checkpoints) with the C conversions and record makers, and
    with ACKSCOPE_PURE_PYTHON=1 in a new process (the makers are chosen at import)."""
    outputs = []
    for pure in ("0", "1"):
        done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "pass_cpu.py"), *shape, "--repeat", "1"],
                              env={**os.environ, "ACKSCOPE_PURE_PYTHON": pure}, capture_output=True, text=True,
                              check=True)
        outputs.append([line for line in done.stdout.splitlines() if line.startswith("output:")])
    assert len(outputs[0]) == 1 and "digest" in outputs[0][0]
    assert outputs[0] == outputs[1]
