"""Benchmark of the live agent (`ackscope capture`) on loopback against the real RabbitMQ.

Rising rates: at each, a confirm-mode publisher (aio-pika, confirms collected asynchronously) and
an acking consumer (aio-pika, prefetch 500, one ack per message) run for --seconds while the agent
and dumpcap both record. Per rate it prints messages/s achieved, packets/s and frames/s (the
agent's counts for that rate's connections), the agent's kernel drops, the agent's frames against
dumpcap's file decoded by tshark (method frames, by method, for that rate's connections), the
agent's CPU in cores over the step, and its RSS. Then the state-scale check: 10,000 connections
and 100,000 outstanding deliveries through the agent's decoder and live state, peak RSS.

    .venv/bin/python bench/capture.py [--rates 250,500,1000,2000,4000,8000] [--seconds 5] [--tls]

`--tls`: the same over amqps (the broker's TLS listener on 5671, TLS 1.3), the clients writing a
key log that the agent follows (`--tls-keylog`) and tshark decrypts with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HOST = "127.0.0.1"
# --tls (main sets it for the traffic's child processes too): the key log the clients write.
TLS_KEYLOG = os.environ.get("ACKSCOPE_BENCH_TLS_KEYLOG")
PORT = 5671 if TLS_KEYLOG else 5672
TICKS_PER_SECOND = 50


async def connect(name: str):
    import aio_pika
    if not TLS_KEYLOG:
        return await aio_pika.connect(host=HOST, port=PORT, client_properties={"connection_name": name})
    import ssl
    context = ssl.create_default_context(cafile="/var/lib/ackscope-test-tls/ca.pem")
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.keylog_filename = TLS_KEYLOG
    return await aio_pika.connect(host=HOST, port=PORT, ssl=True, ssl_context=context,
                                  client_properties={"connection_name": name})


# -- the traffic (run as child processes: `capture.py publish|consume ...`) ------------------------

async def publish(name: str, queue: str, rate: int, seconds: float) -> None:
    import aio_pika
    connection = await connect(name)
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(queue, auto_delete=False, arguments={"x-expires": 120_000})
    body = b"x" * 64
    pending, sent, started = set(), 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(rate * elapsed) - sent
        for _ in range(max(due, 0)):
            pending.add(asyncio.ensure_future(channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)))
            sent += 1
        done = {f for f in pending if f.done()}
        pending -= done
        await asyncio.sleep(1 / TICKS_PER_SECOND)
    await asyncio.gather(*pending, return_exceptions=True)
    print(json.dumps({"published": sent, "seconds": time.monotonic() - started}), flush=True)
    await connection.close()


async def consume(name: str, queue: str, seconds: float) -> None:
    connection = await connect(name)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=500)
    declared = await channel.declare_queue(queue, auto_delete=False, arguments={"x-expires": 120_000})
    received = 0

    async def on_message(message):
        nonlocal received
        received += 1
        await message.ack()

    await declared.consume(on_message)
    await asyncio.sleep(seconds)
    print(json.dumps({"consumed": received}), flush=True)
    await connection.close()


# -- measuring the agent ------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def scrape(port: int, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def tshark_frames_by_port(capture: str) -> dict[int, Counter]:
    """tshark's AMQP frames by method per client port (content header/body and heartbeats too)."""
    from analyzer.spec import METHODS
    keys = ["-o", f"tls.keylog_file:{TLS_KEYLOG}"] if TLS_KEYLOG else []
    out = subprocess.run(["tshark", *keys, "-r", capture, "-Y", "amqp", "-T", "fields", "-e", "tcp.srcport", "-e", "tcp.dstport",
                          "-e", "amqp.type", "-e", "amqp.method.class", "-e", "amqp.method.method",
                          "-E", "occurrence=a", "-E", "aggregator=,"], capture_output=True, text=True).stdout
    names = {"2": "content.header", "3": "content.body", "8": "heartbeat"}
    by_port: dict[int, Counter] = {}
    for line in out.splitlines():
        sport, dport, types, classes, methods = (line.split("\t") + ["", "", ""])[:5]
        port = int(dport) if int(sport) == PORT else int(sport)
        counts = by_port.setdefault(port, Counter())
        class_ids, method_ids = iter(classes.split(",") if classes else []), iter(methods.split(",") if methods else [])
        for frame_type in types.split(","):
            if frame_type == "1":
                counts[METHODS[(int(next(class_ids)), int(next(method_ids)))]] += 1
            elif frame_type in names:
                counts[names[frame_type]] += 1
    return by_port


def agent_frames(lake_dir: str, prefix: str) -> tuple[Counter, set[int], int]:
    """Method frames of the connections named prefix*, their client ports, and their AMQP frames
    (content frames included) from the connection facts."""
    from analyzer import lake, schema
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS).to_pylist()
    chosen = [c for c in connections if (c["connection_name"] or "").startswith(prefix)]
    ids = {c["connection_id"] for c in chosen}
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES, ["connection_id", "method"])
    methods = Counter(m for cid, m in zip(frames["connection_id"].to_pylist(), frames["method"].to_pylist()) if cid in ids)
    total = sum(c["frames_to_broker"] + c["frames_to_client"] for c in chosen)
    return methods, {c["client_port"] for c in chosen}, total


def run_rates(rates: list[int], seconds: float, out: str) -> list[dict]:
    lake_dir, capture = os.path.join(out, "lake"), os.path.join(out, "dumpcap.pcapng")
    metrics_port = 9_000 + os.getpid() % 1000
    dumpcap = subprocess.Popen(["dumpcap", "-i", "lo", "-f", f"tcp port {PORT}", "-B", "64", "-w", capture, "-q"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    agent = subprocess.Popen([sys.executable, "-m", "analyzer.cli", "capture", "--iface", "lo", "--port", str(PORT),
                              "--lake", lake_dir, "--metrics-addr", f"127.0.0.1:{metrics_port}", "--agent-id", "bench",
                              "--flush-interval", "5", "--json", *(["--tls-keylog", TLS_KEYLOG] if TLS_KEYLOG else [])],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, cwd=ROOT)
    for _ in range(600):
        try:
            scrape(metrics_port, "ackscope_agent_packets_total")
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(1.0)  # dumpcap's start, too
    steps = []
    for rate in rates:
        prefix = f"bench-{os.getpid()}-{rate}-"
        queue = f"bench.{os.getpid()}.{rate}"
        drops0, cpu0, t0 = scrape(metrics_port, "ackscope_agent_kernel_drops_total"), cpu_seconds(agent.pid), time.monotonic()
        packets0 = scrape(metrics_port, "ackscope_agent_packets_total")
        me = [sys.executable, os.path.abspath(__file__)]
        consumer = subprocess.Popen(me + ["consume", prefix + "consumer", queue, str(seconds + 2)], stdout=subprocess.PIPE, text=True)
        time.sleep(0.5)
        publisher = subprocess.Popen(me + ["publish", prefix + "publisher", queue, str(rate), str(seconds)],
                                     stdout=subprocess.PIPE, text=True)
        published = json.loads(publisher.communicate()[0])
        consumed = json.loads(consumer.communicate()[0])
        cpu1, t1 = cpu_seconds(agent.pid), time.monotonic()
        steps.append({"rate": rate, "prefix": prefix, "published": published["published"],
                      "publish_seconds": published["seconds"], "consumed": consumed["consumed"],
                      "kernel_drops": scrape(metrics_port, "ackscope_agent_kernel_drops_total") - drops0,
                      "agent_cores": (cpu1 - cpu0) / (t1 - t0),
                      "packets_per_second": (scrape(metrics_port, "ackscope_agent_packets_total") - packets0) / (t1 - t0), "rss_mib": memory_kib(agent.pid, "VmRSS") / 1024,
                      "step_seconds": t1 - t0})
    peak_rss = memory_kib(agent.pid, "VmHWM") / 1024
    time.sleep(1.0)
    dumpcap.send_signal(signal.SIGINT)
    dumpcap.wait()
    agent.send_signal(signal.SIGTERM)
    report = json.loads(agent.communicate()[0])
    tshark = tshark_frames_by_port(capture)
    for step in steps:
        methods, ports, total = agent_frames(lake_dir, step["prefix"])
        reference = Counter()
        for port in ports:
            reference.update(tshark.get(port, Counter()))
        reference_total = sum(reference.values())
        reference_methods = Counter({m: n for m, n in reference.items() if m not in ("content.header", "content.body")})
        step.update(agent_frames=total, tshark_frames=reference_total,
                    methods_equal=Counter({m: n for m, n in methods.items() if m in reference_methods or "." in m
                                           and not m.startswith(("tcp.", "amqp.", "capture."))}) == reference_methods,
                    frames_per_second=total / step["publish_seconds"], peak_rss_mib=peak_rss)
    return steps, report


# -- the state-scale check ------------------------------------------------------------------------

def state_scale(connections: int, deliveries_each: int) -> dict:
    """`connections` consumer connections, each holding `deliveries_each` unacked deliveries, fed through
    the agent's decoder and live state in this process (the socket aside): peak RSS."""
    from analyzer.pandas_probe import answer_pandas_probe_without_pandas
    answer_pandas_probe_without_pandas()  # as `ackscope capture` does, and its memory pool
    import pyarrow
    pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child would report its parent's peak.
    baseline = memory_kib(os.getpid(), "VmHWM") / 1024
    from pamqp import commands

    from analyzer.agent.decoder import LiveDecoder
    from analyzer.agent.live_state import LiveState
    from analyzer.agent.run import release_freed_memory
    from analyzer.labels import SeriesCaps
    from analyzer.packets import LINKTYPE_ETHERNET
    from tests.wire import Conversation, content, handshake, method

    decoder = LiveDecoder(source="bench", agent_id="bench", broker_ports=(PORT,), linktype=LINKTYPE_ETHERNET)
    state = LiveState(SeriesCaps())
    opening = handshake(name="bench-scale") + [
        (0, method(commands.Basic.Qos(prefetch_count=0))), (1, method(commands.Basic.QosOk())),
        (0, method(commands.Basic.Consume(queue="q", consumer_tag="c"))), (1, method(commands.Basic.ConsumeOk("c")))]
    deliveries = b"".join(content(commands.Basic.Deliver("c", tag, False, "", "q"), b"body %d" % tag)
                          for tag in range(1, deliveries_each + 1))
    started = time.perf_counter()
    packet = decoder.flows.packet
    number = 0
    for n in range(connections):
        conv = Conversation(client=(bytes([10, 1 + n // 65000, (n // 250) % 256, n % 250 + 1]), 40000 + n % 20000),
                            broker=(bytes([10, 0, 0, 2]), PORT))
        for seg in conv.open() + conv.script(opening) + conv.send(1, deliveries):
            number += 1
            packet(number, time.time_ns(), seg)
        if n % 500 == 499:  # as the agent's ticks do, each with its trim
            frames, rows, ended_rows, ended = decoder.take()
            state.feed(rows, ended, decoder.connection_facts())
            release_freed_memory()
    frames, rows, ended_rows, ended = decoder.take()
    state.feed(rows, ended, decoder.connection_facts())
    gauges_started = time.perf_counter()
    gauges = state.gauges(time.time_ns())
    return {"connections": connections, "outstanding_deliveries": int(sum(gauges["ackscope_unacked_deliveries"].values())),
            "feed_seconds": round(gauges_started - started, 1), "scrape_seconds": round(time.perf_counter() - gauges_started, 3),
            "peak_rss_mib": round(memory_kib(os.getpid(), "VmHWM") / 1024, 1),
            "rss_before_mib": round(baseline, 1)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "scale":  # in a process of its own: nothing else in its RSS
        print(json.dumps(state_scale(int(sys.argv[2]), int(sys.argv[3]))))
        return
    if len(sys.argv) > 1 and sys.argv[1] in ("publish", "consume"):
        mode, *rest = sys.argv[1:]
        if mode == "publish":
            asyncio.run(publish(rest[0], rest[1], int(rest[2]), float(rest[3])))
        else:
            asyncio.run(consume(rest[0], rest[1], float(rest[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="250,500,1000,2000,4000,8000", help="messages per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per rate")
    parser.add_argument("--scale-connections", type=int, default=10_000)
    parser.add_argument("--scale-deliveries", type=int, default=10, help="outstanding deliveries per connection")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--tls", action="store_true", help="amqps on 5671, decrypted with the clients' key log")
    args = parser.parse_args()
    if shutil.which("dumpcap") is None or shutil.which("tshark") is None:
        sys.exit("dumpcap and tshark are needed: deploy/ci/services.sh installs them")
    with tempfile.TemporaryDirectory(prefix="ackscope-bench-capture-") as out:
        if args.tls:
            global TLS_KEYLOG, PORT
            TLS_KEYLOG = os.environ["ACKSCOPE_BENCH_TLS_KEYLOG"] = os.path.join(out, "keys.log")
            os.close(os.open(TLS_KEYLOG, os.O_CREAT | os.O_WRONLY, 0o600))  # the agent wants it private
            PORT = 5671
        steps, report = run_rates([int(r) for r in args.rates.split(",")], args.seconds, out)
    print(f"{'rate':>6} {'pub/s':>6} {'ack/s':>6} {'pkt/s':>7} {'frames/s':>8} {'drops':>5} {'agent frames':>12} {'tshark':>7} "
          f"{'methods=':>8} {'cores':>6} {'RSS MiB':>8}")
    for s in steps:
        print(f"{s['rate']:>6} {s['published'] / s['publish_seconds']:>6.0f} {s['consumed'] / s['publish_seconds']:>6.0f} "
              f"{s['packets_per_second']:>7.0f} {s['frames_per_second']:>8.0f} "
              f"{s['kernel_drops']:>5.0f} {s['agent_frames']:>12} {s['tshark_frames']:>7} {str(s['methods_equal']):>8} "
              f"{s['agent_cores']:>6.3f} {s['rss_mib']:>8.1f}")
    print(f"agent: {report['packets']:,} packets in {report['seconds']:.0f}s, kernel drops {report['kernel_drops']}, "
          f"peak RSS {steps[-1]['peak_rss_mib']:.0f} MiB, flushes {report['flushes']}")
    scale = None
    if not args.skip_scale:
        scale = json.loads(subprocess.run([sys.executable, os.path.abspath(__file__), "scale", str(args.scale_connections),
                                           str(args.scale_deliveries)], capture_output=True, text=True, check=True).stdout)
        print(f"state scale: {scale['connections']:,} connections, {scale['outstanding_deliveries']:,} outstanding "
              f"deliveries: peak RSS {scale['peak_rss_mib']} MiB ({scale['rss_before_mib']} MiB before; fed in {scale['feed_seconds']}s, a scrape "
              f"{scale['scrape_seconds']}s)")
    if args.json:
        print(json.dumps({"steps": steps, "agent": report, "scale": scale}, default=str))


if __name__ == "__main__":
    main()
