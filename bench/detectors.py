"""The per-connection detectors (analyzer.detectors) beside the state machine, on generated
connections (bench/frames_generator.py): the time they add to the machine's pass, and the memory
they hold, on the largest connection and on every one.

Each connection is streamed through `analyzer.timeline.Timelines` in Arrow batches, as the Spark
pass will do, and every record handed to the detectors as it comes out; frames go to the
detectors when `wants_frame` picks them. Memory: tracemalloc's peak over the pass with the
detectors minus the peak of the same pass without them (the machine's own state), and the bytes of
the detectors' state as a checkpoint stores it (analyzer/detectors/state.py), taken before the
data ends: the detectors fold what the machine's horizon allows after every batch, as the pass does.

    .venv/bin/python bench/detectors.py [--frames 1200000] [--hot-deliveries 450000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))

from analyzer.detectors import ConnectionDetectors, wants_frame  # noqa: E402
from analyzer.detectors.state import to_state  # noqa: E402
from analyzer.timeline import Timelines  # noqa: E402
from analyzer.timeline.metrics_stream import item_horizons  # noqa: E402
from bench.frames_generator import Params, generate  # noqa: E402
from analyzer.detectors.thresholds import Thresholds  # noqa: E402

BATCH = 50_000


def held_bytes(detectors: ConnectionDetectors) -> int:
    """Bytes of the detectors' state as the checkpoint stores it (JSON)."""
    return len(json.dumps(to_state(detectors), separators=(",", ":")))


def run(tables, connection_row, with_detectors: bool, thresholds: Thresholds):
    timelines = Timelines()
    detectors = ConnectionDetectors(connection_row, thresholds) if with_detectors else None
    records = frames = 0
    held = 0
    for table in tables:
        for batch in table.to_batches(max_chunksize=BATCH):
            for row in batch.to_pylist():
                frames += 1
                out = timelines.feed(row)
                if detectors is not None:
                    if wants_frame(row):
                        detectors.frame(row)
                    for record in out:
                        detectors.record(record)
                records += len(out)
            if detectors is not None and timelines.connections:
                (timeline,) = timelines.connections.values()
                detectors.fold(*item_horizons(timeline))
    if detectors is not None:
        held = held_bytes(detectors)
    out = timelines.end_of_data()
    records += len(out)
    findings = []
    if detectors is not None:
        for record in out:
            detectors.record(record)
        findings = detectors.findings(lambda seqs: [None] * len(seqs))
    return frames, records, held, findings


def measure(tables, row, thresholds, traced: bool) -> dict:
    result = {}
    for with_detectors in (False, True):
        if traced:
            tracemalloc.start()
        started = time.process_time()
        frames, records, held, findings = run(tables, row, with_detectors, thresholds)
        cpu = time.process_time() - started
        key = "with" if with_detectors else "without"
        result[f"cpu_{key}"] = cpu
        if traced:
            result[f"peak_{key}"] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        if with_detectors:
            result.update(frames=frames, records=records, held=held,
                          findings=sorted(f["kind"] for f in findings))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1_200_000)
    parser.add_argument("--hot-deliveries", type=int, default=450_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    params = Params(frames=args.frames, hot_deliveries=args.hot_deliveries, seed=args.seed)
    thresholds = Thresholds()
    connections = []
    for item in generate(params):
        if isinstance(item, dict):
            break
        done, row = item
        connections.append((done.n, list(done.tables()), row))
    connections.sort(key=lambda c: -c[0])
    n, tables, row = connections[0]
    hot = measure(tables, row, thresholds, traced=False)
    print(f"largest connection: {hot['frames']:,} frames, {hot['records']:,} records; "
          f"CPU {hot['cpu_without']:.1f} s machine alone, {hot['cpu_with']:.1f} s with the detectors "
          f"(+{100 * (hot['cpu_with'] / hot['cpu_without'] - 1):.0f}%); findings {hot['findings']}")
    traced = measure(tables, row, thresholds, traced=True)
    print(f"  memory (tracemalloc peak): machine alone {traced['peak_without'] / 1e6:.1f} MB, with the detectors "
          f"{traced['peak_with'] / 1e6:.1f} MB (+{(traced['peak_with'] - traced['peak_without']) / 1e6:.1f} MB); "
          f"the detectors' state {traced['held'] / 1e6:.3f} MB")
    most_held, cpu_without, cpu_with, total_frames = (0, ""), 0.0, 0.0, 0
    for n, tables, row in connections[1:]:
        m = measure(tables, row, thresholds, traced=False)
        cpu_without += m["cpu_without"]
        cpu_with += m["cpu_with"]
        total_frames += m["frames"]
        most_held = max(most_held, (m["held"], f"{m['frames']:,} frames"))
    print(f"the other {len(connections) - 1} connections: {total_frames:,} frames; CPU {cpu_without:.1f} s machine "
          f"alone, {cpu_with:.1f} s with the detectors (+{100 * (cpu_with / max(cpu_without, 1e-9) - 1):.0f}%); "
          f"most held by one: {most_held[0] / 1e6:.2f} MB ({most_held[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
