"""Pieces benchmark: `ackscope ingest` of a ring of files against one file of the same capture.

The capture is decode.py's (bench/out/, recorded from the broker on first use): bulk (a confirm-
mode stream, ~30 frames per segment) and chatty (~1.3 frames per segment, many more packets per
frame). `editcap -c` cuts it into a ring of N files at packet boundaries, as dumpcap's ring
buffer would. In the same run, interleaved (a noisy neighbour hurts both alike), best of R:

- whole: `ackscope ingest capture.pcapng` (fresh lake)
- ring:  `ackscope ingest ring_*.pcapng` (fresh lake): the files read as one capture, the flows
  continued across the boundaries (issue 61's target: at most 5% slower than whole)
- scheduled: one `ackscope ingest ring_K.pcapng` per file into one lake, each continuing the
  flows the lake saved (a process start and three commits per file: shown, not a target)

and checks that the ring's lake holds the whole's frame and connection rows. Wall time is the
target; the least CPU time of each (threads included) is printed beside it, the steadier figure
on a machine shared with other work.

    .venv/bin/python bench/pieces.py [--files 10] [--repeat 5] [--only bulk|chatty]
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH_DIR))
sys.path.insert(0, BENCH_DIR)

from decode import Traffic, best_of, load_or_record, timed  # noqa: E402

TARGET_RATIO = 1.05  # ring over whole, wall time
ACKSCOPE = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "ackscope")


def ring_of(path: str, files: int, out_dir: str) -> list[str]:
    """The capture cut into `files` files of as many packets each (the last one shorter)."""
    packets = int(subprocess.run(["capinfos", "-c", "-M", "-T", "-r", path], capture_output=True, text=True,
                                 check=True).stdout.split()[-1])
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run(["editcap", "-c", str(-(-packets // files)), path, os.path.join(out_dir, "ring.pcapng")],
                   check=True, capture_output=True)
    return sorted(glob.glob(os.path.join(out_dir, "ring_*.pcapng")))


def ingest(paths: list[str], lake_dir: str):
    return timed([ACKSCOPE, "ingest", *paths, "--lake", lake_dir, "--json", "--no-progress"], keep_stdout=True)


def fresh(tmp: str) -> str:
    return tempfile.mkdtemp(prefix="ackscope-bench-pieces-", dir=tmp)


def same_rows(whole_lake: str, ring_lake: str) -> bool:
    from analyzer import lake, schema

    def rows(lake_dir: str):
        frames = lake.read_table(lake_dir, "frames", schema.FRAMES).drop_columns(["source", "source_packet"])
        connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS).drop_columns(["source"])
        return (frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]),
                connections.sort_by("connection_id"))

    (frames_a, connections_a), (frames_b, connections_b) = rows(whole_lake), rows(ring_lake)
    return frames_a.equals(frames_b) and connections_a.equals(connections_b)


def least_cpu(runs: list):
    """The run of least CPU time (user + system, threads and children included): on a machine
    shared with other work, wall time measures the neighbours too."""
    return min(runs, key=lambda r: r.cpu_seconds)


def measure(path: str, ring: list[str], repeat: int, tmp: str) -> dict:
    runs = {"whole": [], "ring": [], "scheduled": []}
    for _ in range(repeat):
        for kind in ("whole", "ring"):
            lake_dir = fresh(tmp)
            run = ingest([path] if kind == "whole" else ring, lake_dir)
            if run.returncode != 0:
                raise RuntimeError(f"ackscope ingest ({kind}) exited {run.returncode}")
            runs[kind].append(run)
            if kind == "whole":
                whole_lake = lake_dir
            else:
                equal = same_rows(whole_lake, lake_dir)
                shutil.rmtree(whole_lake, ignore_errors=True)
                shutil.rmtree(lake_dir, ignore_errors=True)
    lake_dir = fresh(tmp)  # once: a process per file
    scheduled = [ingest([piece], lake_dir) for piece in ring]
    shutil.rmtree(lake_dir, ignore_errors=True)
    return {"whole": best_of(runs["whole"]), "ring": best_of(runs["ring"]),
            "cpu": (least_cpu(runs["whole"]).cpu_seconds, least_cpu(runs["ring"]).cpu_seconds),
            "scheduled_seconds": sum(r.seconds for r in scheduled), "equal": equal}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "out"), metavar="DIR",
                        help="where decode.py's captures are cached (default %(default)s)")
    parser.add_argument("--files", type=int, default=10, metavar="N", help="files in the ring (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=5, metavar="R", help="best of R timed runs (default %(default)s)")
    parser.add_argument("--only", choices=["bulk", "chatty"], help="one capture instead of both")
    parser.add_argument("--bulk-messages", type=int, default=200_000, metavar="N")
    parser.add_argument("--chatty-messages", type=int, default=30_000, metavar="N")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--tmp", default=None, metavar="DIR", help="where the throw-away lakes go (default: system temp)")
    args = parser.parse_args(argv)
    for tool in ("dumpcap", "editcap", "capinfos"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (apt-get install tshark)")
    os.makedirs(args.out, exist_ok=True)
    traffic = {"bulk": Traffic("bulk", args.bulk_messages, body_size=100, window=5000, prefetch=1000, ack_every=100),
               "chatty": Traffic("chatty", args.chatty_messages, body_size=32, prefetch=1, ack_every=1)}
    failed = False
    print(f"{'capture':8} {'files':>5} {'whole s':>8} {'ring s':>8} {'ring/whole':>10} {'target':>7} "
          f"{'cpu whole':>9} {'cpu ring':>8} {'cpu ratio':>9} {'scheduled s':>11} {'rows equal':>10}")
    for kind in [args.only] if args.only else ["bulk", "chatty"]:
        capture = load_or_record(traffic[kind], args.out, args.host, args.port, rerecord=False)
        with tempfile.TemporaryDirectory(prefix="ackscope-ring-", dir=args.tmp) as ring_dir:
            ring = ring_of(capture.path, args.files, ring_dir)
            result = measure(capture.path, ring, args.repeat, args.tmp)
        ratio = result["ring"].seconds / result["whole"].seconds
        cpu_whole, cpu_ring = result["cpu"]
        ok = ratio <= TARGET_RATIO and result["equal"]
        failed |= not ok
        print(f"{kind:8} {len(ring):>5} {result['whole'].seconds:>8.2f} {result['ring'].seconds:>8.2f} "
              f"{ratio:>10.3f} {'<= ' + format(TARGET_RATIO, '.2f'):>7} {cpu_whole:>9.2f} {cpu_ring:>8.2f} "
              f"{cpu_ring / cpu_whole if cpu_whole else 0:>9.3f} {result['scheduled_seconds']:>11.2f} "
              f"{str(result['equal']):>10}  {'ok' if ok else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
