"""The agent's compaction (analyzer/agent/compaction.py) on real Delta tables: the same rows in
fewer files, files at the target size left alone, and appends or another compaction landing while a
group is merged lose and duplicate nothing."""

from __future__ import annotations

import json
import os
import threading
import time

import pyarrow as pa
import pytest

from analyzer import lake, schema
from analyzer.agent import compaction
from analyzer.agent.sink import LakeSink

DAYS = ("2026-12-05", "2026-12-06")


def _frames(n: int, start: int, day: str) -> pa.Table:
    ts_ns = int(pa.scalar(day, pa.string()).cast(pa.timestamp("s")).value) * 10**9 + 3600 * 10**9
    columns = {"date": [day] * n, "ts_ns": [ts_ns + i for i in range(n)],
               "connection_id": [f"c{(start + i) % 7}" for i in range(n)], "agent_id": ["a"] * n,
               "seq": list(range(start, start + n)), "direction": ["c2s"] * n,
               "method": ["basic.publish" if i % 2 else "basic.ack" for i in range(n)],
               "message_id": [f"m-{start + i}" for i in range(n)], "delivery_tag": list(range(start, start + n))}
    return pa.Table.from_arrays([pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type)
                                 for f in schema.FRAMES], schema=schema.FRAMES)


def _flush(sink: LakeSink, batches: int, rows: int = 200, start: int = 0) -> None:
    for b in range(batches):
        sink.add("frames", _frames(rows, start + b * rows, DAYS[b % 2]))
        assert sink.flush()


def _rows(lake_dir: str) -> list[dict]:
    table = lake.read_table(lake_dir, "frames", schema.FRAMES)
    assert table.schema == schema.FRAMES
    return sorted(table.to_pylist(), key=lambda r: (r["seq"], r["connection_id"]))


def _files(lake_dir: str) -> dict:
    return lake.table_files(lake.open_table(lake_dir, "frames"))


def test_compaction_keeps_every_row_and_its_day_in_fewer_files_committed_as_no_data_change(tmp_path):
    lake_dir = str(tmp_path / "lake")
    sink = LakeSink(lake_dir, "merge")
    _flush(sink, 10)
    before, files_before = _rows(lake_dir), _files(lake_dir)
    sink.compact()
    after = _files(lake_dir)
    assert _rows(lake_dir) == before                      # same rows, same schema, each under its day
    assert len(after) == 2 and not set(after) & set(files_before)  # ten small files: one a day
    assert sorted(p["date"] for _, p in after.values()) == list(DAYS)
    assert all(path.split("/")[0] == f"date={p['date']}" for path, (_, p) in after.items())
    log_dir = os.path.join(lake_dir, "frames", "_delta_log")
    entries = [json.loads(line) for name in sorted(os.listdir(log_dir)) if name.endswith(".json")
               for line in open(os.path.join(log_dir, name))]
    adds = [e["add"] for e in entries if "add" in e and "compacted" in e["add"]["path"]]
    removes = [e["remove"] for e in entries if "remove" in e]
    assert len(adds) == 2 and len(removes) == 10 and not any(a["dataChange"] for a in adds + removes)
    sink.compact()                                        # nothing left to merge: nothing changes
    assert _files(lake_dir) == after and _rows(lake_dir) == before


def test_files_at_the_target_size_are_never_rewritten(tmp_path, monkeypatch):
    lake_dir = str(tmp_path / "lake")
    sink = LakeSink(lake_dir, "target")
    _flush(sink, 12)
    sink.compact()
    done = set(_files(lake_dir))
    assert len(done) == 2
    # The merged files are at the target from now on; the next flushes' files are under it.
    monkeypatch.setattr(compaction, "TARGET_FILE_BYTES", min(size for size, _ in _files(lake_dir).values()))
    _flush(sink, 8, start=10_000)
    rows = _rows(lake_dir)
    sink.compact()
    files = _files(lake_dir)
    assert done < set(files) and len(files) == 4        # the merged files stayed; the 8 new ones: one a day
    assert _rows(lake_dir) == rows


def _meanwhile(monkeypatch, when: str, action) -> None:
    """`action` run once inside the next compaction's first group: after its files are merged and
    before its commit reads the table ("merged"), or after that read and before Delta's commit
    ("committing": lake.add_missing_columns runs between the two)."""
    name = {"merged": "TableWriter.write_merged", "committing": "add_missing_columns"}[when]
    owner, attribute = (lake.TableWriter, "write_merged") if "." in name else (lake, name)
    original = getattr(owner, attribute)

    def then_action(*args):
        result = original(*args)
        if getattr(owner, attribute) is then_action:
            monkeypatch.setattr(owner, attribute, original)
            action()
        return result

    monkeypatch.setattr(owner, attribute, then_action)


@pytest.mark.parametrize("when", ["merged", "committing"])
def test_an_append_landing_while_a_group_is_merged_is_kept_once(tmp_path, monkeypatch, when):
    lake_dir = str(tmp_path / "lake")
    sink, other = LakeSink(lake_dir, "compacting"), LakeSink(lake_dir, "appending")
    _flush(sink, 6)
    expected = _rows(lake_dir)
    _meanwhile(monkeypatch, when, lambda: _flush(other, 1, start=50_000))
    sink.compact()
    rows = _rows(lake_dir)
    assert len(rows) == len(expected) + 200 and [r for r in rows if r["seq"] < 50_000] == expected
    assert len({(r["connection_id"], r["seq"]) for r in rows}) == len(rows)
    assert len(_files(lake_dir)) == 3                     # both days merged, the append beside them


@pytest.mark.parametrize("when", ["merged", "committing"])
def test_a_group_another_compaction_merged_first_fails_cleanly_and_nothing_is_lost(tmp_path, monkeypatch, caplog, when):
    lake_dir = str(tmp_path / "lake")
    sink, rival = LakeSink(lake_dir, "late"), LakeSink(lake_dir, "first")
    _flush(sink, 6)
    expected = _rows(lake_dir)
    _meanwhile(monkeypatch, when, rival.compact)          # merges and removes these very files first
    merged, failed = compaction.compact_table(lake_dir, "frames", {})
    assert failed >= 1 and "was not merged (tried again later)" in caplog.text
    assert _rows(lake_dir) == expected
    assert len(_files(lake_dir)) == 2
    sink.compact()
    assert _rows(lake_dir) == expected and len(_files(lake_dir)) == 2


def test_appends_and_compactions_from_threads_lose_and_duplicate_nothing(tmp_path, monkeypatch):
    """Real concurrency: two agents compacting in a loop while a third appends, each on its own thread."""
    lake_dir = str(tmp_path / "lake")
    appender = LakeSink(lake_dir, "appender")
    _flush(appender, 4)
    # Two or three small files a group: many commits, each a chance to race.
    monkeypatch.setattr(compaction, "GROUP_BYTES", 3 * max(size for size, _ in _files(lake_dir).values()))
    done = threading.Event()

    def compacting(agent_id):
        sink = LakeSink(lake_dir, agent_id)
        while not done.is_set():
            sink.compact()

    threads = [threading.Thread(target=compacting, args=(name,)) for name in ("x", "y")]
    for thread in threads:
        thread.start()
    try:
        _flush(appender, 16, start=4 * 200)
    finally:
        done.set()
        for thread in threads:
            thread.join()
    rows = _rows(lake_dir)
    assert [r["seq"] for r in rows] == list(range(20 * 200))


def test_files_written_before_a_column_existed_merge_with_it_as_nulls(tmp_path):
    lake_dir = str(tmp_path / "lake")
    older = pa.schema([f for f in schema.FRAMES if f.name != "message_id"])
    for start in (0, 100):
        writer = lake.TableWriter(lake_dir, "frames", older)
        writer.write(_frames(100, start, DAYS[0]).drop_columns(["message_id"]))
        writer.commit("an-older-agent", version=1 + start)
    sink = LakeSink(lake_dir, "newer")
    sink.add("frames", _frames(100, 200, DAYS[0]))
    assert sink.flush()
    before = _rows(lake_dir)
    sink.compact()
    assert len(_files(lake_dir)) == 1 and _rows(lake_dir) == before
    assert [r["message_id"] for r in before] == [None] * 200 + [f"m-{i}" for i in range(200, 300)]


def test_sinks_keeping_their_tables_open_commit_around_each_other_and_a_compaction(tmp_path):
    """Each sink keeps its table open between flushes (brought up to date, not loaded anew): the
    other agent's commits and a compaction landing between its flushes lose and duplicate nothing,
    and the table it kept follows them (the compacted files gone from it)."""
    lake_dir = str(tmp_path / "lake")
    sinks = [LakeSink(lake_dir, "kept-a"), LakeSink(lake_dir, "kept-b")]
    for n in range(12):
        sink = sinks[n % 2]
        sink.add("frames", _frames(50, n * 50, DAYS[n % 2]))
        assert sink.flush(), sink.last_error
        if n == 6:
            sinks[1].compact()
    kept = sinks[0].tables["frames"].delta
    assert kept is not None  # kept since the last flush (a compaction drops it for a fresh load)
    kept.update_incremental()
    assert set(lake.table_files(kept)) == set(_files(lake_dir))
    assert [r["seq"] for r in _rows(lake_dir)] == list(range(600))
    table = lake.open_table(lake_dir, "frames")
    assert [table.transaction_version(f"ackscope-agent-kept-{x}") for x in "ab"] == [6, 6]


def _written_after(ms: int) -> None:
    """Return once the clock's milliseconds are past `ms`: a file written from now on has a
    later modification time than every file written before (an order, not a wait for an event)."""
    while int(time.time() * 1000) <= ms:
        time.sleep(0.001)


def test_the_agent_merges_only_the_small_files_older_than_its_min_age(tmp_path):
    lake_dir = str(tmp_path / "lake")
    sink = LakeSink(lake_dir, "aged")
    _flush(sink, 6)
    rows, fresh = _rows(lake_dir), _files(lake_dir)
    sink.compact(min_age_s=3600)                          # none an hour old: nothing merged
    assert _files(lake_dir) == fresh and _rows(lake_dir) == rows
    old = compaction.written_ms(lake.open_table(lake_dir, "frames"))
    _written_after(max(old.values()))
    _flush(sink, 4, start=10_000)
    newer, rows = set(_files(lake_dir)) - set(fresh), _rows(lake_dir)
    merged, failed = compaction.compact_table(lake_dir, "frames", {}, written_before_ms=max(old.values()) + 1)
    files = _files(lake_dir)
    assert (merged, failed) == (6, 0) and not set(files) & set(fresh)
    assert newer < set(files) and len(files) == len(newer) + 2  # the older six: one file a day
    assert _rows(lake_dir) == rows
    sink.compact(min_age_s=0)                             # everything is old enough: the newer ones too
    assert len(_files(lake_dir)) == 2 and _rows(lake_dir) == rows


def test_files_an_ingest_left_provisional_are_never_merged(tmp_path):
    lake_dir = str(tmp_path / "lake")
    sink = LakeSink(lake_dir, "beside-an-ingest")
    _flush(sink, 4)
    writer = lake.TableWriter(lake_dir, "frames", schema.FRAMES, prefix=f"{lake.PROVISIONAL_PREFIX}-0123abcd")
    for start in (20_000, 30_000):
        writer.write(_frames(50, start, DAYS[0]))
    writer.commit("an-ingest")
    provisional = lake.files_named(lake_dir, "frames", f"{lake.PROVISIONAL_PREFIX}-0123abcd")
    assert len(provisional) == 2
    rows = _rows(lake_dir)
    sink.compact()
    files = _files(lake_dir)
    assert set(provisional) < set(files) and len(files) == 4  # the agent's four files: one a day
    assert _rows(lake_dir) == rows
