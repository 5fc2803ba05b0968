"""The agent's loop without a socket or a broker: a capture file's packets replayed again and again
through the agent's decoder, live state and sink, as fast as they go, to see what grows.

The packets of the file are read once into memory; each round hands them to LiveDecoder in
batches of TICK_S of capture time, their timestamps moved on by the file's duration per round (so
each round's connections are new ones: a connection's id includes its first-seen time), the
decoder's clock following them. At every tick the rows go to LiveState and LakeSink as the agent
hands them (run.Agent._tick); every --flush-interval seconds of capture time the sink flushes
(in this thread, or in a thread of its own with --sink-thread, as the agent does), and the freed
heap is trimmed as the agent trims it. Set up as `ackscope capture` sets itself up (the
allocators' settings before pyarrow and delta-rs load). After each round: RSS, its anonymous part by
kind of mapping (bench/smaps.py), and Python's object allocator (arenas and bytes in use).

    .venv/bin/python bench/agent_replay.py CAPTURE.pcapng [--rounds 20] [--no-sink] [--no-state]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from analyzer.cli import answer_pandas_probe_without_pandas, choose_agent_allocators  # noqa: E402

choose_agent_allocators()


def pymalloc() -> tuple[int, int]:
    """(arenas allocated now, bytes in allocated blocks) of Python's object allocator."""
    read, write = os.pipe()
    saved = os.dup(2)
    chunks = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read, 65536), b"")))
    reader.start()
    os.dup2(write, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(write)
        os.close(saved)
    reader.join()
    os.close(read)
    arenas = used = 0
    for line in b"".join(chunks).decode().splitlines():
        if line.startswith("# arenas allocated current"):
            arenas = int(line.split("=")[1].replace(",", ""))
        elif line.startswith("# bytes in allocated blocks"):
            used = int(line.split("=")[1].replace(",", ""))
    return arenas, used


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--flush-interval", type=float, default=10.0, metavar="SECONDS")
    parser.add_argument("--no-sink", action="store_true", help="rows are made and dropped: no LakeSink")
    parser.add_argument("--no-state", action="store_true", help="no LiveState (the state machine and labels)")
    parser.add_argument("--sink-thread", action="store_true", help="flush in a thread of its own, as the agent")
    parser.add_argument("--port", type=int, action="append", help="broker port (default: the file's busiest)")
    parser.add_argument("--compact-every", type=int, default=0, metavar="ROUNDS", help="after every so many "
                        "rounds the sink compacts (LakeSink.compact, as the agent's --compact-interval), its "
                        "peak RSS over the RSS before it printed")
    parser.add_argument("--rename", metavar="PREFIX", help="each round, these bytes (the clients' connection "
                        "name prefix, e.g. soak.py's soakPID) replaced by as many of the round's own, so every "
                        "round's connections name new applications as the soak's do")
    parser.add_argument("--tracemalloc", action="store_true", help="Python's allocations traced: at the end, "
                        "the lines whose live memory grew most since the end of the second round")
    args = parser.parse_args()

    answer_pandas_probe_without_pandas()
    import pyarrow
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())

    from analyzer import labels
    from analyzer.agent.decoder import LiveDecoder, connection_rows_table
    from analyzer.agent.live_state import LiveState
    from analyzer.agent.run import TICK_S, TRIM_EVERY_S, release_freed_memory
    from analyzer.agent.sink import LakeSink
    from analyzer.capture_file import read_packets
    from bench import smaps
    from bench.capture import memory_kib

    packets = [(ts, link, data) for _, ts, link, data in read_packets(args.capture)]
    linktype = packets[0][1]
    first, last = packets[0][0], packets[-1][0]
    span = last - first + 1_000_000_000
    ports = args.port or [_busiest_port(packets)]
    print(f"{len(packets)} packets over {span / 1e9:.0f} s, broker port {ports}", flush=True)
    lake_dir = tempfile.mkdtemp(prefix="ackscope-replay-")
    now = [first]
    decoder = LiveDecoder(source="replay", agent_id="replay", broker_ports=ports, linktype=linktype,
                          clock=lambda: now[0])
    state = LiveState(labels.SeriesCaps(labels.DEFAULT_MAX_APPLICATIONS, labels.DEFAULT_MAX_VHOSTS))
    sink = None if args.no_sink else LakeSink(os.path.join(lake_dir, "lake"), "replay")
    flushing: threading.Thread | None = None

    def flush():
        nonlocal flushing
        if not args.sink_thread:
            sink.flush()
            return
        if flushing is not None:
            flushing.join()
        flushing = threading.Thread(target=sink.flush)
        flushing.start()

    if args.tracemalloc:
        import tracemalloc
        tracemalloc.start()
    baseline = None
    print(f"{'round':>5} {'rss MB':>7} {'anon MB':>8} " + " ".join(f"{k:>6}" for k in smaps.KINDS)
          + f" {'py arenas':>9} {'py MB':>6} {'conns':>6}", flush=True)
    tick_ns, flush_ns, trim_ns = int(TICK_S * 1e9), int(args.flush_interval * 1e9), int(TRIM_EVERY_S * 1e9)
    for round_ in range(args.rounds):
        shift = round_ * span
        next_tick, next_flush, next_trim = first + shift, first + shift + flush_ns, first + shift
        batch = []
        old = args.rename.encode() if args.rename else None
        new = f"r{round_:0{len(old) - 1}d}".encode()[-len(old):] if old else None
        for ts, _, data in packets:
            ts += shift
            if old is not None and old in data:
                data = data.replace(old, new)
            batch.append((ts, data))
            if ts < next_tick:
                continue
            now[0] = ts
            decoder.packets_in(batch)
            batch = []
            next_tick = ts + tick_ns
            frames, rows, connection_rows, ended = decoder.take()
            if not args.no_state:
                state.feed(rows, ended, decoder.connection_facts())
            if sink is not None:
                sink.add("frames", frames)
                if connection_rows:
                    sink.add("connections", connection_rows_table(connection_rows))
                if ts >= next_flush:
                    next_flush = ts + flush_ns
                    flush()
            if ts >= next_trim:
                next_trim = ts + trim_ns
                release_freed_memory()
        if batch:
            decoder.packets_in(batch)
        if flushing is not None:
            flushing.join()
        pid = os.getpid()
        if sink is not None and args.compact_every and (round_ + 1) % args.compact_every == 0:
            before = memory_kib(pid, "VmRSS") / 1024
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")  # VmHWM back to the RSS of now: the next peak is the compaction's
            sink.compact()
            print(f"compaction: RSS {before:.1f} MB before, peak {memory_kib(pid, 'VmHWM') / 1024:.1f} MB",
                  flush=True)
        maps = smaps.anonymous(pid)
        arenas, used = pymalloc()
        print(f"{round_ + 1:5d} {memory_kib(pid, 'VmRSS') / 1024:7.1f} {memory_kib(pid, 'RssAnon') / 1024:8.1f} "
              + " ".join(f"{mb:6.1f}" for mb in smaps.by_kind(maps).values())
              + f" {arenas:9d} {used / 2**20:6.1f} {decoder.flows_seen:6d}", flush=True)
        if args.tracemalloc and round_ == 1:
            baseline = tracemalloc.take_snapshot()
    if baseline is not None:
        print("Python's live memory that grew most since round 2 (KiB, blocks, line):")
        for stat in tracemalloc.take_snapshot().compare_to(baseline, "lineno")[:20]:
            frame = stat.traceback[0]
            print(f"  {stat.size_diff / 1024:+9.1f} {stat.count_diff:+8d}  {frame.filename}:{frame.lineno}")
    return 0


def _busiest_port(packets) -> int:
    from collections import Counter

    from analyzer.packets import tcp_segment
    ports: Counter = Counter()
    for _, link, data in packets[:20000]:
        segment = tcp_segment(link, data)
        if segment is not None:
            ports.update((segment.sport, segment.dport))
    return ports.most_common(1)[0][0]


if __name__ == "__main__":
    sys.exit(main())
