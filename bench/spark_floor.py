"""What Spark's cheapest passes over a frames table cost: the floor under `ackscope analyze`.

The analysis cannot cost less than reading its input once, ordering it by connection (each
connection goes through the state machine in seq order) and writing its outputs. This times those
elementary passes on the same lake and master as bench/analyze.py, each as its own Spark action
over the timeline's input columns (analyzer.timeline.INPUT_COLUMNS), so the analysis can be read
against them:

- scan: read every input column of every frame, write nothing (Spark's `noop` sink);
- sort: shuffle by connection, sort by (connection, channel, seq), write nothing;
- write: the sorted input written as Parquet (the outputs are about as many rows as the input);
- arrow pass: the shape of the analysis' one pass (spark_jobs/connection_pass.py) with nothing in
  it: shuffle by connection, sort by (connection, seq), hand every frame to Python through Arrow as
  a row (the dicts the state machine reads; batches cut by rows alone, as the pass's) and count them.

    .venv/bin/python bench/spark_floor.py LAKE [--master local[1]] [--driver-memory 2g] [--json]
        [--steps 'scan,sort,write,arrow pass']
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


STEPS = ("scan", "sort", "write", "arrow pass")


def passes(frames, scratch: str, names=STEPS) -> dict:
    from pyspark.sql import functions as F

    from spark_jobs.timeline.plans import arrow_batches_by_rows

    def noop(df):
        df.write.format("noop").mode("overwrite").save()

    def by_channel(df):
        return df.repartition("connection_id").sortWithinPartitions("connection_id", "channel", "seq")

    def arrow_pass():
        import pyarrow as pa

        def count_rows(batches):
            rows = 0
            for batch in batches:
                rows += len(batch.to_pylist())
            yield pa.RecordBatch.from_pydict({"rows": [rows]})

        shaped = (frames.repartition(int(frames.sparkSession.conf.get("spark.sql.shuffle.partitions")),
                                     "connection_id")
                  .sortWithinPartitions("connection_id", "seq").mapInArrow(count_rows, "rows long"))
        with arrow_batches_by_rows(frames.sparkSession):   # as the pass's (connection_pass.summarised_pass)
            return shaped.agg(F.sum("rows")).first()[0]

    steps = {
        "scan": lambda: noop(frames),
        "sort": lambda: noop(by_channel(frames)),
        "write": lambda: by_channel(frames).write.mode("overwrite").parquet(os.path.join(scratch, "sorted")),
        "arrow pass": arrow_pass,
    }
    seconds = {}
    for name in names:
        started = time.perf_counter()
        steps[name]()
        seconds[name] = round(time.perf_counter() - started, 2)
        print(f"  {name}: {seconds[name]:.1f} s", file=sys.stderr, flush=True)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lake")
    parser.add_argument("--master", default="local[1]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help="the passes to time, in this order (default %(default)s)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.steps.split(",") if n.strip()]
    unknown = [n for n in names if n not in STEPS]
    if unknown or not names:
        parser.error(f"--steps: {', '.join(unknown) or 'none given'}; the steps are {', '.join(STEPS)}")

    from analyzer import schema
    from analyzer.timeline import INPUT_COLUMNS
    from spark_jobs.delta_io import read_delta
    from spark_jobs.session import get_spark

    spark = get_spark(args.master, app_name="ackscope-floor", driver_memory=args.driver_memory)
    frames = read_delta(spark, args.lake, "frames", schema.FRAMES, "bridge").select(*INPUT_COLUMNS)
    rows = frames.count()
    with tempfile.TemporaryDirectory(prefix="ackscope-floor-") as scratch:
        seconds = passes(frames, scratch, names)
    result = {"master": args.master, "frames": rows, "seconds": seconds}
    print(json.dumps(result) if args.json else
          f"{args.master}, {rows:,} frames: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
