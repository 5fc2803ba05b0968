"""What the agent's compaction adds to its memory, and what cheap settings change it (issue 62).

The same small files (bench/compaction.py's: `--minutes` of the churn soak's 10 s flushes, frames
and connections) are compacted by `LakeSink.compact` in a process of its own per variant, set up as
`ackscope capture` sets itself up, after a first compaction of a few files (so the Parquet reader's
and writer's first use is paid before, as in an agent that ran one already). A thread samples the
process's RSS and anonymous RSS every 5 ms during the measured compaction. Variants:

- `default`: as the agent runs;
- `mmap-threshold`: glibc's mmap threshold fixed at 128 KiB (mallopt, before anything allocates
  much): blocks above it are mapped and unmapped on their own, never kept in the heap;
- `arena-max-2`: at most 2 glibc arenas (mallopt);
- `group-4mb`: merge groups of 4 MiB instead of compaction.GROUP_BYTES.

With --steps, instead: the default compaction of the first table, step by step in one process
(the log loaded, each group merged and committed, the checkpoint, the vacuum), each step's peak of
anonymous memory over its start, the heap trimmed between steps.

    nice -n 10 .venv/bin/python bench/compaction_knobs.py [--minutes 15] [--repeat 2] [--steps]
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

VARIANTS = ("default", "mmap-threshold", "arena-max-2", "group-4mb")

CHILD = """
import ctypes, json, os, sys, threading, time
variant, warm_dir, lake_dir = sys.argv[1:4]
libc = ctypes.CDLL("libc.so.6")
if variant == "mmap-threshold":
    assert libc.mallopt(-3, 128 * 1024)      # M_MMAP_THRESHOLD
if variant == "arena-max-2":
    assert libc.mallopt(-8, 2)               # M_ARENA_MAX
from analyzer.cli import answer_pandas_probe_without_pandas, choose_agent_allocators
choose_agent_allocators()
answer_pandas_probe_without_pandas()
import pyarrow
pyarrow.set_memory_pool(pyarrow.system_memory_pool())
from analyzer.agent import compaction
from analyzer.agent.sink import LakeSink
if variant == "group-4mb":
    compaction.GROUP_BYTES = 4 * 1024 * 1024

def kib(*keys):
    values = {}
    for line in open("/proc/self/status"):
        key = line.split(":")[0]
        if key in keys:
            values[key] = int(line.split()[1])
    return [values[k] for k in keys]

LakeSink(warm_dir, "warm").compact()
libc.malloc_trim(0)
time.sleep(0.2)
rss0, anon0 = kib("VmRSS", "RssAnon")
peak = [rss0, anon0]
done = threading.Event()
def sample():
    while not done.is_set():
        rss, anon = kib("VmRSS", "RssAnon")
        peak[0], peak[1] = max(peak[0], rss), max(peak[1], anon)
        time.sleep(0.005)
sampler = threading.Thread(target=sample)
sampler.start()
started = time.perf_counter()
LakeSink(lake_dir, "bench").compact()
seconds = time.perf_counter() - started
done.set()
sampler.join()
libc.malloc_trim(0)
rss1, anon1 = kib("VmRSS", "RssAnon")
print(json.dumps({"rss_before": rss0 / 1024, "anon_before": anon0 / 1024, "rss_peak": peak[0] / 1024,
                  "anon_peak": peak[1] / 1024, "anon_after": anon1 / 1024, "seconds": seconds}))
"""


STEPS = """
import ctypes, sys, threading, time
warm_dir, lake_dir = sys.argv[1:3]
from analyzer.cli import answer_pandas_probe_without_pandas, choose_agent_allocators
choose_agent_allocators()
answer_pandas_probe_without_pandas()
import pyarrow
pyarrow.set_memory_pool(pyarrow.system_memory_pool())
from analyzer import lake
from analyzer.agent import compaction
from analyzer.agent.sink import LakeSink
libc = ctypes.CDLL("libc.so.6")

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

LakeSink(warm_dir, "warm").compact()
peak = [0.0]
def sample():
    while True:
        peak[0] = max(peak[0], anon())
        time.sleep(0.003)
threading.Thread(target=sample, daemon=True).start()

def step(name, work):
    libc.malloc_trim(0)
    time.sleep(0.05)
    before = peak[0] = anon()
    out = work()
    time.sleep(0.02)
    print(f"{name:34s} anonymous before {before:6.1f} MiB, peak +{peak[0] - before:5.1f}, after +{anon() - before:5.1f}",
          flush=True)
    return out

table = step("log loaded (frames)", lambda: lake.open_table(lake_dir, "frames"))
stored = pyarrow.schema(table.schema().to_arrow())
days = {path: (size, partition.get("date")) for path, (size, partition) in lake.table_files(table).items()}
groups = compaction.small_file_groups(days, compaction.TARGET_FILE_BYTES, compaction.GROUP_BYTES)
for i, (day, paths) in enumerate(groups):
    writer = lake.TableWriter(lake_dir, "frames", stored, prefix=compaction.COMPACTED_PREFIX)
    step(f"group {i} merged ({len(paths)} files)", lambda: writer.write_merged(day, paths))
    step(f"group {i} committed", lambda: writer.commit(compaction.COMPACTION_APP_ID, {}, version=i + 1, remove=paths,
                                                      data_change=False))
table = lake.open_table(lake_dir, "frames")
step("checkpoint", table.create_checkpoint)
step("vacuum", lambda: table.vacuum(retention_hours=1, enforce_retention_duration=False, dry_run=False))
"""


def build(lake_dir: str, flushes: int) -> None:
    from analyzer.agent.sink import LakeSink
    from bench.compaction import connections, frames
    sink = LakeSink(lake_dir, "bench")
    for k in range(flushes):
        sink.add("frames", frames(k))
        sink.add("connections", connections(k))
        assert sink.flush(), sink.last_error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="minutes of 10 s flushes to compact")
    parser.add_argument("--repeat", type=int, default=2, help="rounds of every variant, interleaved")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--steps", action="store_true", help="the default compaction step by step instead")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="ackscope-knobs-")
    try:
        build(os.path.join(base, "lake"), int(args.minutes * 6))
        build(os.path.join(base, "warm"), 6)
        if args.steps:
            subprocess.run([sys.executable, "-c", STEPS, os.path.join(base, "warm"), os.path.join(base, "lake")],
                           cwd=ROOT, check=True)
            return 0
        print(f"{'variant':15s} {'rss before':>10s} {'rss peak':>9s} {'rss +':>6s} {'anon before':>11s} "
              f"{'anon peak':>9s} {'anon +':>7s} {'anon after':>10s} {'s':>5s}")
        for _ in range(args.repeat):
            for variant in args.variants.split(","):
                lake_dir, warm_dir = (os.path.join(base, f"{variant}-{name}") for name in ("lake", "warm"))
                for name, copy in (("lake", lake_dir), ("warm", warm_dir)):
                    shutil.rmtree(copy, ignore_errors=True)
                    shutil.copytree(os.path.join(base, name), copy)
                out = subprocess.run([sys.executable, "-c", CHILD, variant, warm_dir, lake_dir], cwd=ROOT,
                                     capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(out.stderr[-3000:])
                got = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{variant:15s} {got['rss_before']:10.1f} {got['rss_peak']:9.1f} "
                      f"{got['rss_peak'] - got['rss_before']:6.1f} {got['anon_before']:11.1f} {got['anon_peak']:9.1f} "
                      f"{got['anon_peak'] - got['anon_before']:7.1f} {got['anon_after']:10.1f} {got['seconds']:5.1f}",
                      flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
