"""Soak of the live agent (`ackscope capture`) under connection churn of issue 62's shape.

About 5 connections a second open, publish 20 confirmed messages, read them back and close,
every 20th dying with a reset, beside two long-lived confirm-mode publishers at 100 msg/s each
(tests/churn.py). The agent captures a relay of its own on lo (tests/agent_support.BrokerRelay),
so it sees only this traffic however busy the shared broker is. Every --every seconds (a minute)
it prints the agent's RSS (current and peak; and its anonymous part, the agent's own heap: the rest
is shared libraries' pages, ~160 MB of pyarrow and delta-rs code, shared between processes and
reclaimable), its CPU in % of one core over the interval, the frames/s it decoded, the files in
its lake (data and log) and its threads (delta-rs's Tokio threads among them); at the end the
slope of RSS (and of anonymous RSS) over the last two thirds of the run, the agent's exit and
whether every publish the clients sent is in the lake exactly once under its connection.

With --merge-every, the soak plays the scheduled analysis beside the agent: that often it merges
what a complete run that analysed the lake's current frames version merges after it
(spark_jobs/compaction.merge_analysed_input, in the soak's process, not the agent's), so the
agent's own compaction finds nothing older than its --compact-min-age.

    nice -n 10 .venv/bin/python bench/soak.py [--minutes 30] [--every 60] [--merge-every 300] [-- capture flags...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import smaps  # noqa: E402
from bench.capture import cpu_seconds, memory_kib, scrape  # noqa: E402


def files_on_disk(lake_dir: str) -> tuple[int, int, int]:
    """(data files, log files, bytes) under the lake."""
    data = log = size = 0
    for folder, _, names in os.walk(lake_dir):
        for name in names:
            size += os.path.getsize(os.path.join(folder, name))
            if "_delta_log" in folder:
                log += 1
            elif name.endswith(".parquet"):
                data += 1
    return data, log, size


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (minute, MB) points."""
    n = len(points)
    if n < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else float("nan")


def filed_once(lake_dir: str, sent: dict[str, int]) -> dict:
    """The lake's publishes per connection_name against the clients' counts, and duplicate rows."""
    from analyzer import lake, schema
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS, ["connection_id", "connection_name"])
    names = dict(zip(connections["connection_id"].to_pylist(), connections["connection_name"].to_pylist()))
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES, ["connection_id", "seq", "method"])
    filed, seen, duplicates = {}, set(), 0
    for cid, seq, method in zip(*(frames[c].to_pylist() for c in ("connection_id", "seq", "method"))):
        if (cid, seq) in seen:
            duplicates += 1
        seen.add((cid, seq))
        if method == "basic.publish":
            filed[names.get(cid)] = filed.get(names.get(cid), 0) + 1
    wrong = {name: (n, filed.get(name, 0)) for name, n in sent.items() if filed.get(name, 0) != n}
    return {"publishes_sent": sum(sent.values()), "publishes_filed": sum(filed.get(n, 0) for n in sent),
            "connections_differing": len(wrong), "duplicate_rows": duplicates}


def merge_beside(lake_dir: str) -> dict[str, int]:
    """What the analysis merges after a complete run of the lake's current frames version."""
    from analyzer import lake
    from spark_jobs.compaction import merge_analysed_input
    started = time.monotonic()
    merged = merge_analysed_input(lake_dir, lake.open_table(lake_dir, "frames").version(), "soak")
    print(f"      merged beside in {time.monotonic() - started:.1f} s: {merged}", flush=True)
    return merged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=60.0, metavar="SECONDS", help="print a line this often")
    parser.add_argument("--out", help="keep the lake here (default: a temporary folder, removed); with --out, the "
                        "agent's stderr is kept in it too (agent.stderr)")
    parser.add_argument("--smaps", action="store_true", help="every line, the agent's anonymous memory by kind of "
                        "mapping (bench/smaps.py: brk heap, glibc thread arenas, thread stacks, other mmap'd "
                        "blocks), and at the end the mappings that grew most over the last two thirds")
    parser.add_argument("--merge-every", type=float, metavar="SECONDS", help="merge what a complete analysis run "
                        "merges after it (frames files of the current version, connections' small files) this often")
    parser.add_argument("capture_flags", nargs="*", help="extra `ackscope capture` flags, after --")
    args = parser.parse_args()

    from tests.agent_support import BrokerRelay, free_port
    from tests.churn import Churn

    out = args.out or tempfile.mkdtemp(prefix="ackscope-soak-")
    lake_dir = os.path.join(out, "lake")
    relay = BrokerRelay()
    relay.start()
    metrics_port = free_port()
    agent = subprocess.Popen([sys.executable, "-m", "analyzer.cli", "capture", "--iface", "lo", "--port",
                              str(relay.port), "--lake", lake_dir, "--metrics-addr", f"127.0.0.1:{metrics_port}",
                              "--agent-id", "soak", "--json", *args.capture_flags],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        try:
            scrape(metrics_port, "ackscope_agent_packets_total")
            break
        except OSError:
            if agent.poll() is not None:
                print(agent.stderr.read(), file=sys.stderr)
                return 1
            time.sleep(0.1)
    churn = Churn(relay.port, f"soak{os.getpid()}").start()
    print(f"soak: {args.minutes:g} min of churn into {lake_dir} (agent pid {agent.pid})", flush=True)
    print(f"{'min':>5} {'rss MB':>7} {'anon MB':>8} {'peak MB':>8} {'cpu %':>6} {'frames/s':>9} {'conns':>6} "
          f"{'data':>5} {'log':>5} {'lake MB':>8} {'threads':>7}", flush=True)
    started = last_t = time.monotonic()
    last_cpu, last_frames = cpu_seconds(agent.pid), 0.0
    points, anon_points, failed = [], [], None
    next_merge, merged = (started + args.merge_every if args.merge_every else float("inf")), {}
    samples: list[tuple[float, list[dict]]] = []

    def smaps_columns(minute: float) -> str:
        if not args.smaps:
            return ""
        maps = smaps.anonymous(agent.pid)
        samples.append((minute, maps))
        return "".join(f" {k} {mb:5.1f}" for k, mb in smaps.by_kind(maps).items())
    while time.monotonic() - started < args.minutes * 60:
        time.sleep(max(0.0, min(args.every, started + args.minutes * 60 - time.monotonic())))
        if agent.poll() is not None:
            failed = f"the agent exited with {agent.returncode} after {(time.monotonic() - started) / 60:.1f} min"
            break
        now, cpu = time.monotonic(), cpu_seconds(agent.pid)
        frames = scrape(metrics_port, "ackscope_agent_frames_total")
        rss, peak = memory_kib(agent.pid, "VmRSS") / 1024, memory_kib(agent.pid, "VmHWM") / 1024
        anon = memory_kib(agent.pid, "RssAnon") / 1024
        data, log, size = files_on_disk(lake_dir)
        minute = (now - started) / 60
        points.append((minute, rss))
        anon_points.append((minute, anon))
        print(f"{minute:5.1f} {rss:7.1f} {anon:8.1f} {peak:8.1f} {100 * (cpu - last_cpu) / (now - last_t):6.1f} "
              f"{(frames - last_frames) / (now - last_t):9.0f} {churn.opened:6d} {data:5d} {log:5d} "
              f"{size / 2**20:8.1f} {memory_kib(agent.pid, 'Threads'):7d}" + smaps_columns(minute), flush=True)
        last_t, last_cpu, last_frames = now, cpu, frames
        if time.monotonic() >= next_merge:
            next_merge = time.monotonic() + args.merge_every
            for name, n in merge_beside(lake_dir).items():
                merged[name] = merged.get(name, 0) + n
    churn.stop()
    time.sleep(2.0)  # the last frames reach the agent before it stops
    peak = memory_kib(agent.pid, "VmHWM") / 1024 if agent.poll() is None else float("nan")
    if agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
    stdout, stderr = agent.communicate(timeout=300)
    relay.close()
    if args.out:
        with open(os.path.join(out, "agent.stderr"), "w") as f:
            f.write(stderr)
    if args.out and samples:
        with open(os.path.join(out, "smaps.json"), "w") as f:
            json.dump([{"minute": minute, "mappings": maps} for minute, maps in samples], f)
    if len(samples) > 1:
        first = next(maps for minute, maps in samples if minute >= samples[-1][0] / 3)
        print("anonymous mappings that grew most over the last two thirds:", flush=True)
        for line in smaps.growth(first, samples[-1][1]):
            print("  " + line, flush=True)
    last_two_thirds = (lambda series: [p for p in series if p[0] >= series[-1][0] / 3] if series else [])
    summary = {"minutes": round(points[-1][0], 1) if points else 0, "peak_rss_mb": round(peak, 1),
               "rss_slope_mb_per_min_last_two_thirds": round(slope_per_minute(last_two_thirds(points)), 3),
               "anon_rss_slope_mb_per_min_last_two_thirds": round(slope_per_minute(last_two_thirds(anon_points)), 3),
               "connections_opened": churn.opened, "resets": churn.resets, "client_errors": churn.errors[:5],
               "agent_exit": agent.returncode, "files_merged_beside": merged}
    if agent.returncode == 0:
        report = json.loads(stdout)
        summary.update(errors=report["error_count"], kernel_drops=report["kernel_drops"],
                       rows_dropped=report["rows_dropped"], **filed_once(lake_dir, dict(churn.sent)))
        summary["files_at_exit"] = dict(zip(("data", "log", "bytes"), files_on_disk(lake_dir)))
    else:
        summary["agent_stderr"] = stderr[-2000:]
    if failed:
        summary["failed"] = failed
    print(json.dumps(summary, indent=1), flush=True)
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    return 0 if agent.returncode == 0 and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
