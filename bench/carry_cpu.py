"""The carried state machine's Python on a hot connection, without Spark: what an incremental run's
carry step spends on the connection that bounds it (bench/README.md, "Session 22").

    .venv/bin/python bench/carry_cpu.py [--frames 300000] [--hot-deliveries 120000] [--carried 0.4] [--repeat 12]

The generator's (frames_generator.py) largest connection is analysed whole up to the last
`--carried` share of its frames (analyzer/timeline/carry.py's WholeConnection: the checkpoint a
run leaves), and the rest is carried on from that checkpoint (`continue_connection`, as the
carried pass feeds a connection's new frames, without channel_metrics and the detectors beside
it). Printed: the rows fed, each run's process CPU seconds, the best, and a digest of the records
that came out (the same input must give the same digest before and after a change).
"""

import argparse
import hashlib
import os
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.dirname(BENCH_DIR))

import frames_generator as generator  # noqa: E402
from pass_cpu import SPARK_BATCH_ROWS, pass_input  # noqa: E402

from analyzer.timeline.carry import WholeConnection, continue_connection, dump, load  # noqa: E402
from analyzer.columns import batch_rows  # noqa: E402
from spark_jobs.connection_pass import HEADER_SEQ  # noqa: E402

BUCKET_NS = 10 * 10**9


def hot_connection(params: generator.Params) -> list[dict]:
    """The frame rows of the generated lake's largest connection, in seq order, as the pass gets them."""
    rows, _ = pass_input(params)
    by_connection: dict[str, list[dict]] = {}
    for batch in rows.to_batches(max_chunksize=SPARK_BATCH_ROWS):
        for row in batch_rows(batch):
            if row["seq"] != HEADER_SEQ:
                by_connection.setdefault(row["connection_id"], []).append(row)
    return max(by_connection.values(), key=len)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_arguments(parser)
    parser.set_defaults(frames=300_000, hot_deliveries=120_000)
    parser.add_argument("--carried", type=float, default=0.4, help="the share of its frames carried on")
    parser.add_argument("--repeat", type=int, default=12)
    args = parser.parse_args(argv)

    rows = hot_connection(generator.params_from_args(args))
    cut = len(rows) - int(len(rows) * args.carried)
    whole = WholeConnection(rows[0]["connection_id"], rows[0]["agent_id"], lambda record: None, BUCKET_NS)
    for row in rows[:cut]:
        whole.feed(row)
    checkpoint = whole.finish()
    if checkpoint is None:
        print(f"the connection left no checkpoint ({whole.no_checkpoint}): nothing to carry")
        return 1
    state = dump(checkpoint)
    print(f"input: {len(rows):,} frames of the hot connection, the last {len(rows) - cut:,} carried on")
    times, out = [], None
    for _ in range(args.repeat):
        carried_from = load(state)  # each run resumes its own copy: the machine changes what it is fed
        started = time.process_time()
        out = continue_connection(carried_from, rows[cut:], BUCKET_NS)
        times.append(time.process_time() - started)
    if out.fallback is not None:
        print(f"the carry fell back: {out.fallback}")
        return 1
    print("CPU s per run: " + ", ".join(f"{t:.3f}" for t in times))
    best = min(times)
    print(f"best of {args.repeat}: {best:.3f} CPU s, {(len(rows) - cut) / best:,.0f} frames per CPU s")
    digest = hashlib.sha256("\n".join(sorted(map(repr, out.rows))).encode()).hexdigest()[:16]
    print(f"output: {len(out.rows):,} records, digest {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
