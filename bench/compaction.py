"""The agent's compaction against delta-rs's `optimize.compact`, peak memory in the same run (issue 62).

Builds the agent's small files as the churn soak (bench/soak.py) leaves them: one `frames` and one
`connections` file per 10 s flush (LakeSink flushes of generated rows shaped like the soak's:
~1,230 frames/s, ~5 connections/s), the same rows into two lakes. Then, as an agent compacting every
`--interval` minutes does, round after round: `--interval` minutes more of files, and each lake
compacted in a process of its own, set up as `ackscope capture` sets itself up (delta-rs's
jemalloc handing freed pages back, pyarrow on the system allocator): one lake by
`DeltaTable.optimize.compact()` (the agent before), the other by `LakeSink.compact` (now). Each
line: files before and after, RSS before the compaction, peak RSS (VmHWM) and what it added, and
the ratio new/old of what each added. Both compactions' rows are counted against what was flushed.

    nice -n 10 .venv/bin/python bench/compaction.py [--rounds 4] [--interval 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FLUSH_S = 10
FRAMES_PER_S = 1_230
CONNECTIONS_PER_S = 5
METHODS = ("basic.publish", "basic.ack", "basic.get", "basic.get-ok", "basic.ack", "basic.publish",
           "queue.declare", "queue.declare-ok", "channel.open", "confirm.select")
DAY = "2026-12-06"
DAY_NS = 1_796_515_200 * 10**9  # 2026-12-06T00:00:00Z

CHILD = """
import json, os, sys, time
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
import pyarrow
pyarrow.set_memory_pool(pyarrow.system_memory_pool())
from analyzer import lake
from analyzer.agent.sink import LakeSink, TABLES

def kib(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

lake_dir, route = sys.argv[1], sys.argv[2]
sink = LakeSink(lake_dir, "bench")
files = lambda: sum(len(lake.table_files(lake.open_table(lake_dir, n))) for n in TABLES)
before_files = files()
before = kib("VmRSS")
started = time.perf_counter()
if route == "optimize":  # the agent's compaction before issue 62's second part, as it was
    import math
    for name in TABLES:
        table = lake.open_table(lake_dir, name)
        table.optimize.compact()
        table = lake.open_table(lake_dir, name)
        table.create_checkpoint()
        table.vacuum(retention_hours=math.ceil(sink.retention_hours), enforce_retention_duration=False, dry_run=False)
else:
    sink.compact()
seconds = time.perf_counter() - started
rows = {n: lake.logged_rows(lake.open_table(lake_dir, n)) for n in TABLES}
print(json.dumps({"files_before": before_files, "files_after": files(), "rss_before_mib": before / 1024,
                  "peak_mib": kib("VmHWM") / 1024, "seconds": seconds, "rows": rows}))
"""


def frames(flush: int):
    import pyarrow as pa
    from analyzer import schema
    n = FRAMES_PER_S * FLUSH_S
    first = flush * n
    seqs = pa.array(range(first, first + n), pa.int64())
    conns = [f"127.0.0.1:{40000 + (first + i) // 60 % 20000}>127.0.0.1:5672@{DAY_NS + first // 60}"
             for i in range(n)]
    columns = {
        "date": pa.array([DAY] * n), "ts_ns": pa.array([DAY_NS + (first + i) * 813_000 for i in range(n)], pa.int64()),
        "connection_id": pa.array(conns), "agent_id": pa.array(["bench"] * n), "seq": seqs,
        "direction": pa.array(["c2s" if i % 3 else "s2c" for i in range(n)]),
        "channel": pa.array([1] * n, pa.int32()), "method": pa.array([METHODS[i % len(METHODS)] for i in range(n)]),
        "client_addr": pa.array(["127.0.0.1"] * n), "client_port": pa.array([40000 + (first + i) // 60 % 20000 for i in range(n)], pa.int32()),
        "server_addr": pa.array(["127.0.0.1"] * n), "server_port": pa.array([5672] * n, pa.int32()),
        "delivery_tag": pa.array([(first + i) % 20 + 1 for i in range(n)], pa.int64()),
        "routing_key": pa.array([f"churn-q-{(first + i) // 60}" for i in range(n)]),
        "message_id": pa.array([f"{first + i:032x}" if i % 2 else None for i in range(n)]),
        "message_identity": pa.array([f"{(first + i) * 2654435761 % 2**128:032x}" for i in range(n)]),
        "body_size": pa.array([256] * n, pa.int64()), "source": pa.array(["lo"] * n),
    }
    columns["ts"] = columns["ts_ns"].cast(pa.timestamp("ns", tz="UTC")).cast(pa.timestamp("us", tz="UTC"), safe=False)
    return pa.Table.from_arrays([columns[f.name].cast(f.type) if f.name in columns else pa.nulls(n, f.type)
                                 for f in schema.FRAMES], schema=schema.FRAMES)


def connections(flush: int):
    from analyzer.ingest import connections_table
    n = CONNECTIONS_PER_S * FLUSH_S
    return connections_table([{"connection_id": f"c-{flush}-{i}", "first_ts_ns": DAY_NS + flush * 10**10 + i,
                               "last_ts_ns": DAY_NS + flush * 10**10 + i + 4 * 10**9, "protocol": "amqp-0-9-1",
                               "connection_name": f"churn-{flush}-{i}", "client_product": "pika"}
                              for i in range(n)])


def compact_in_child(lake_dir: str, route: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, lake_dir, route], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{route} compaction failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--interval", type=float, default=10.0, help="minutes of files between compactions")
    parser.add_argument("--out", help="keep the lakes here (default: a temporary folder, removed)")
    args = parser.parse_args()
    from analyzer.agent.sink import LakeSink

    base = args.out or tempfile.mkdtemp(prefix="ackscope-compaction-")
    routes = ("optimize", "streamed")
    sinks = {route: LakeSink(os.path.join(base, route), "bench") for route in routes}
    per_round = int(args.interval * 60 / FLUSH_S)
    flushed = {"frames": 0, "connections": 0}
    print(f"{per_round} flushes ({args.interval:g} min) a round; frames {FRAMES_PER_S * FLUSH_S} rows a flush")
    print("round  route     files  ->  after  rss before  peak MiB  added MiB  seconds  rows ok")
    added = {route: [] for route in routes}
    try:
        for round_ in range(args.rounds):
            for k in range(round_ * per_round, (round_ + 1) * per_round):
                batch = {"frames": frames(k), "connections": connections(k)}
                for name, rows in batch.items():
                    flushed[name] += rows.num_rows
                for sink in sinks.values():
                    for name, rows in batch.items():
                        sink.add(name, rows)
                    assert sink.flush(), sink.last_error
            for route in routes:
                got = compact_in_child(os.path.join(base, route), route)
                added[route].append(got["peak_mib"] - got["rss_before_mib"])
                ok = got["rows"] == flushed
                print(f"{round_ + 1:5d}  {route:8s}  {got['files_before']:5d}  -> {got['files_after']:5d}  "
                      f"{got['rss_before_mib']:10.0f}  {got['peak_mib']:8.0f}  {added[route][-1]:9.0f}  "
                      f"{got['seconds']:7.1f}  {'yes' if ok else 'NO ' + str(got['rows'])}")
    finally:
        if not args.out:
            shutil.rmtree(base, ignore_errors=True)
    worst = {route: max(values) for route, values in added.items()}
    print(f"largest added: optimize {worst['optimize']:.0f} MiB, streamed {worst['streamed']:.0f} MiB, "
          f"ratio streamed/optimize {worst['streamed'] / worst['optimize']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
