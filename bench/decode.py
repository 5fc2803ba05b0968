"""Decode benchmark: `ackscope ingest` against tshark on captures of real RabbitMQ traffic.

Two captures are recorded from the broker on the loopback interface and cached in bench/out/:

- bulk: a confirm-mode publisher streams with a window of 5000 outstanding confirms and a
  consumer (prefetch 1000) acks with multiple=true every 100 deliveries. About 30 frames per
  TCP segment; 200,000 messages make about 1.2 million AMQP frames.
- chatty: a confirm-mode publisher sends method, content header and body as separate segments
  (TCP_NODELAY, one send per frame) and waits for each confirm; a prefetch-1 consumer acks each
  delivery on its own. The broker still writes basic.deliver, header and body in one segment,
  so this lands at about 1.3 frames per segment.

The clients speak AMQP over raw sockets (frames marshalled by pamqp once, then reused): only
there do we control how frames are grouped into segments, and pika's BlockingConnection with
confirms waits for each message (about 2,000 msg/s here, against 12,000-30,000 for this one).

Each file is then decoded by `ackscope ingest --json` (fresh lake per run) and by
`tshark -Y amqp -T fields -e amqp.method.method` (see TSHARK_PREFS), best of N wall-clock runs,
and a table compares frames per second and ackscope's peak RSS against the targets.
`--profile` runs ackscope's decoder in-process under cProfile.

    .venv/bin/python bench/decode.py [--repeat 3] [--workers 2] [--profile] [--rerecord]
"""

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

from pamqp import body as amqp_body
from pamqp import commands, frame, header
from pamqp.exceptions import UnmarshalingException

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
GNU_TIME = "/usr/bin/time"
SNAPLEN = 262144
CAPTURE_BUFFER_MB = 256   # dumpcap's default 2 MB kernel buffer dropped packets during bulk recording
RECORD_ATTEMPTS = 3
MIN_BULK_FRAMES = 1_000_000

TARGETS = {"bulk": 3.0, "chatty": 5.0}   # ackscope frames/s over tshark frames/s
TARGET_WORKERS_SPEEDUP = 1.8             # with --workers 2, against --workers 1
TARGET_RSS_MB = 500


# -- a minimal AMQP 0-9-1 client over a raw socket ------------------------------------------------

_FRAME_HEADER = struct.Struct("!BHI")
_METHOD_ID = struct.Struct("!HH")
_TAG = struct.Struct("!Q")
FRAME_METHOD = 1
FRAME_END = 0xCE
BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
CHANNEL_CLOSE = (20, 40)
CONNECTION_CLOSE = (10, 50)
CHANNEL = 1


class BrokerClosed(RuntimeError):
    """The broker closed the channel or connection: the benchmark traffic is wrong."""


class Wire:
    """One AMQP connection with one channel. Setup RPCs go through pamqp; the hot paths parse
    frames themselves from `self.buf`, so that the clients are not slower than the broker."""

    def __init__(self, sock: socket.socket, broker: tuple[str, int], *, nodelay: bool, name: str):
        self.sock = sock
        sock.connect(broker)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if nodelay else 0)
        self.buf = bytearray()
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self._expect(commands.Connection.Start, channel=0)
        self._send(commands.Connection.StartOk(client_properties={"product": f"ackscope-bench {name}"},
                                               mechanism="PLAIN", response="\0guest\0guest"), 0)
        tune = self._expect(commands.Connection.Tune, channel=0)
        self._send(commands.Connection.TuneOk(channel_max=tune.channel_max or 2047,
                                              frame_max=min(tune.frame_max or 131072, 131072), heartbeat=0), 0)
        self.rpc(commands.Connection.Open(virtual_host="/"), commands.Connection.OpenOk, channel=0)
        self.rpc(commands.Channel.Open(), commands.Channel.OpenOk)

    def _send(self, value, channel: int = CHANNEL) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def _recv(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise BrokerClosed("the broker closed the socket")
        self.buf += data

    def _expect(self, kind, channel: int = CHANNEL):
        while True:
            try:
                used, got_channel, value = frame.unmarshal(bytes(self.buf))
            except UnmarshalingException:
                self._recv()
                continue
            del self.buf[:used]
            if isinstance(value, (commands.Channel.Close, commands.Connection.Close)):
                raise BrokerClosed(f"{value.name}: {value.reply_code} {value.reply_text}")
            if isinstance(value, kind) and got_channel == channel:
                return value

    def rpc(self, request, reply_kind, channel: int = CHANNEL):
        self._send(request, channel)
        return self._expect(reply_kind, channel)

    def declare(self, queue: str) -> None:
        # auto_delete plus x-expires: an interrupted run leaves no queue behind
        self.rpc(commands.Queue.Declare(queue=queue, auto_delete=True, arguments={"x-expires": 600_000}),
                 commands.Queue.DeclareOk)

    def frames(self):
        """Receive once (blocking), then yield every complete frame as (type, channel, payload)."""
        self._recv()
        buf, start, end = self.buf, 0, len(self.buf)
        try:
            while end - start >= 8:
                frame_type, channel, size = _FRAME_HEADER.unpack_from(buf, start)
                stop = start + 7 + size
                if stop >= end:
                    break
                if buf[stop] != FRAME_END:
                    raise BrokerClosed(f"lost frame sync at byte {start} of the receive buffer")
                payload = bytes(buf[start + 7:stop])
                start = stop + 1
                if frame_type == FRAME_METHOD and _METHOD_ID.unpack_from(payload) in (CHANNEL_CLOSE, CONNECTION_CLOSE):
                    reply_text = payload[7:7 + payload[6]]   # after class, method and reply-code
                    raise BrokerClosed(f"broker closed: {reply_text.decode(errors='replace')}")
                yield frame_type, channel, payload
        finally:
            del buf[:start]

    def close(self) -> None:
        self._send(commands.Connection.Close(reply_code=200, reply_text="bench done", class_id=0, method_id=0), 0)
        self._expect(commands.Connection.CloseOk, channel=0)
        self.sock.close()


def message_frames(queue: str, body_size: int) -> tuple[bytes, bytes, bytes]:
    """basic.publish, content header and body for one transient message, marshalled once."""
    payload = (b"ackscope-bench " * (body_size // 15 + 1))[:body_size]
    return (frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), CHANNEL),
            frame.marshal(header.ContentHeader(0, len(payload), commands.Basic.Properties(delivery_mode=1)), CHANNEL),
            frame.marshal(amqp_body.ContentBody(payload), CHANNEL))


def ack_frame(tag: int, multiple: bool) -> bytes:
    return frame.marshal(commands.Basic.Ack(delivery_tag=tag, multiple=multiple), CHANNEL)


def confirms_in(payload: bytes) -> tuple[int, bool, bool] | None:
    """(delivery tag, multiple, nack) for a broker basic.ack/basic.nack method payload."""
    method = _METHOD_ID.unpack_from(payload)
    if method not in (BASIC_ACK, BASIC_NACK):
        return None
    return _TAG.unpack_from(payload, 4)[0], bool(payload[12] & 1), method == BASIC_NACK


def delivery_tag(payload: bytes) -> int | None:
    if _METHOD_ID.unpack_from(payload) != BASIC_DELIVER:
        return None
    return _TAG.unpack_from(payload, 5 + payload[4])[0]   # after the consumer-tag shortstr


# -- the two traffic patterns ---------------------------------------------------------------------

@dataclass
class Traffic:
    kind: str
    messages: int
    body_size: int
    window: int = 0        # bulk: outstanding confirms; chatty publishes one at a time
    prefetch: int = 1
    ack_every: int = 1


def bulk_publisher(sock, broker, traffic: Traffic, queue: str) -> dict:
    wire = Wire(sock, broker, nodelay=False, name="bulk publisher")
    wire.declare(queue)
    wire.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
    message = b"".join(message_frames(queue, traffic.body_size))
    chunk = 100
    published = confirmed = nacked = 0
    started = time.perf_counter()
    while confirmed < traffic.messages:
        if published < traffic.messages and published - confirmed < traffic.window:
            count = min(chunk, traffic.messages - published)
            wire.sock.sendall(message * count)
            published += count
            if not select.select([wire.sock], [], [], 0)[0]:
                continue
        for frame_type, _channel, payload in wire.frames():
            if frame_type == FRAME_METHOD and (confirm := confirms_in(payload)) is not None:
                tag, multiple, nack = confirm
                settled = tag - confirmed if multiple else 1
                confirmed += settled
                nacked += settled if nack else 0
    elapsed = time.perf_counter() - started
    wire.close()
    return {"role": "publisher", "published": published, "confirmed": confirmed, "nacked": nacked,
            "seconds": elapsed}


def chatty_publisher(sock, broker, traffic: Traffic, queue: str) -> dict:
    wire = Wire(sock, broker, nodelay=True, name="chatty publisher")
    wire.declare(queue)
    wire.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
    method, content_header, content_body = message_frames(queue, traffic.body_size)
    send = wire.sock.sendall
    confirmed = nacked = 0
    started = time.perf_counter()
    for _ in range(traffic.messages):
        send(method)             # one send per frame: with TCP_NODELAY, one segment per frame
        send(content_header)
        send(content_body)
        waiting = True
        while waiting:
            for frame_type, _channel, payload in wire.frames():
                if frame_type == FRAME_METHOD and (confirm := confirms_in(payload)) is not None:
                    confirmed += 1
                    nacked += confirm[2]
                    waiting = False
    elapsed = time.perf_counter() - started
    wire.close()
    return {"role": "publisher", "published": traffic.messages, "confirmed": confirmed, "nacked": nacked,
            "seconds": elapsed}


def consumer(sock, broker, traffic: Traffic, queue: str, ready) -> dict:
    wire = Wire(sock, broker, nodelay=traffic.kind == "chatty", name=f"{traffic.kind} consumer")
    wire.declare(queue)
    wire.rpc(commands.Basic.Qos(prefetch_count=traffic.prefetch), commands.Basic.QosOk)
    wire.rpc(commands.Basic.Consume(queue=queue, consumer_tag="bench"), commands.Basic.ConsumeOk)
    ready.set()
    send = wire.sock.sendall
    delivered = acked = acks_sent = 0
    started = None
    while acked < traffic.messages:
        for frame_type, _channel, payload in wire.frames():
            if frame_type == FRAME_METHOD and (tag := delivery_tag(payload)) is not None:
                delivered = tag
                if traffic.ack_every == 1:
                    send(ack_frame(tag, multiple=False))
                    acked, acks_sent = tag, acks_sent + 1
        started = started or time.perf_counter()
        if delivered - acked >= traffic.ack_every or (delivered == traffic.messages > acked):
            send(ack_frame(delivered, multiple=True))
            acked, acks_sent = delivered, acks_sent + 1
    elapsed = time.perf_counter() - started
    wire.close()
    return {"role": "consumer", "delivered": delivered, "acks_sent": acks_sent, "seconds": elapsed}


def _run_role(role, args, results, foreign_sockets=()) -> None:
    for sock in foreign_sockets:   # another client's socket, inherited by fork: its close must not wait for us
        sock.close()
    try:
        results.put(role(*args))
    except Exception as exc:  # reported by the parent, which stops the capture
        results.put({"role": role.__name__, "error": f"{type(exc).__name__}: {exc}"})


def client_sockets(count: int) -> list[socket.socket]:
    """Sockets bound to their local ports before the capture starts, so that its filter can keep
    out everyone else talking to the shared broker."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    return socks


def drive(traffic: Traffic, socks: list[socket.socket], broker: tuple[str, int], timeout: float) -> list[dict]:
    """Run consumer and publisher as separate processes (each needs a core) until all is acked."""
    ctx = multiprocessing.get_context("fork")   # the children inherit the bound sockets
    results, ready = ctx.Queue(), ctx.Event()
    queue = f"ackscope-bench-{traffic.kind}-{os.getpid()}-{int(time.time())}"
    publisher = bulk_publisher if traffic.kind == "bulk" else chatty_publisher
    consumer_sock, publisher_sock = socks
    procs = [ctx.Process(target=_run_role, args=(consumer, (consumer_sock, broker, traffic, queue, ready), results,
                                                           [publisher_sock]))]
    procs[0].start()
    consumer_sock.close()   # the child's copy is the only one: its close sends the FIN
    if not ready.wait(30):
        procs[0].kill()
        raise RuntimeError("the consumer did not start within 30 s")
    procs.append(ctx.Process(target=_run_role, args=(publisher, (publisher_sock, broker, traffic, queue), results)))
    procs[1].start()
    publisher_sock.close()
    outcome = []
    deadline = time.monotonic() + timeout
    while len(outcome) < 2:
        try:
            outcome.append(results.get(timeout=max(1.0, deadline - time.monotonic())))
        except Exception:
            break
        if "error" in outcome[-1]:
            break
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    errors = [r["error"] for r in outcome if "error" in r]
    if errors or len(outcome) < 2:
        raise RuntimeError(f"{traffic.kind} traffic failed: {errors or 'timed out'}")
    return outcome


# -- recording ------------------------------------------------------------------------------------

class IncompleteCapture(RuntimeError):
    """Packets are missing from a recording: it is thrown away and recorded again."""


def stream_holes(path: str, expected_flows: int) -> list[str]:
    """Every direction of every flow must run from SYN to FIN (or RST) with no byte missing.

    Checked on sequence numbers rather than with tshark's lost-segment marks, which also fire when
    the loopback capture merely holds a segment before the one it follows."""
    cmd = ["tshark", "-r", path, "--disable-protocol", "amqp", "-T", "fields", "-E", "separator=/t",
           "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.seq", "-e", "tcp.len",
           "-e", "tcp.flags.syn", "-e", "tcp.flags.fin", "-e", "tcp.flags.reset"]
    spans: dict[tuple[str, str], list[tuple[int, int]]] = {}
    syn: set[tuple[str, str]] = set()
    fin: set[tuple[str, str]] = set()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        for line in proc.stdout:
            stream, port, seq, length, is_syn, is_fin, is_reset = line.rstrip("\n").split("\t")
            direction = (stream, port)
            spans.setdefault(direction, [])
            if is_syn in ("1", "True"):
                syn.add(direction)
            if is_fin in ("1", "True") or is_reset in ("1", "True"):   # RabbitMQ answers our FIN with a RST
                fin.add(direction)
            if length not in ("", "0"):
                spans[direction].append((int(seq), int(length)))
    problems = []
    flows = {stream for stream, _port in spans}
    if len(flows) != expected_flows:
        problems.append(f"{len(flows)} TCP flows, expected {expected_flows}")
    for direction in sorted(spans):
        where = f"flow {direction[0]} from port {direction[1]}"
        if direction not in syn:
            problems.append(f"{where} has no SYN (the capture began late)")
        if direction not in fin:
            problems.append(f"{where} has no FIN or RST (the capture ended early)")
        covered = 1   # relative sequence numbers: the SYN is 0, the first byte 1
        for seq, length in sorted(spans[direction]):
            if seq > covered:
                problems.append(f"{where} misses bytes {covered}-{seq - 1}")
                break
            covered = max(covered, seq + length)
    return problems


@dataclass
class Capture:
    kind: str
    path: str
    messages: int = 0
    record_seconds: float = 0.0
    traffic_seconds: float = 0.0
    dumpcap_packets: int = 0
    dumpcap_dropped: int = 0
    dumpcap_stats: str = ""
    clients: list = field(default_factory=list)
    reused: bool = False


def _dumpcap_stats(stderr: str) -> tuple[int, int, str]:
    captured = re.search(r"Packets captured: (\d+)", stderr)
    dropped = re.search(r"Packets received/dropped on interface '[^']*': (\d+)/(\d+) \(([^)]*)\)", stderr)
    if not (captured and dropped):
        raise RuntimeError(f"dumpcap did not report its statistics:\n{stderr}")
    detail = dropped.group(3)   # pcap:N/dumpcap:N/flushed:N/ps_ifdrop:N
    lost = int(dropped.group(2)) + sum(int(n) for n in re.findall(r":(\d+)", detail))
    return int(captured.group(1)), lost, dropped.group(0)


def record(traffic: Traffic, path: str, host: str, port: int) -> Capture:
    partial = path + ".recording"
    if os.path.exists(partial):
        os.remove(partial)
    started = time.perf_counter()
    socks = client_sockets(2)
    ours = " or ".join(f"tcp port {sock.getsockname()[1]}" for sock in socks)
    dumpcap = subprocess.Popen(["dumpcap", "-i", "lo", "-f", f"tcp port {port} and ({ours})", "-w", partial, "-s", str(SNAPLEN),
                                "-B", str(CAPTURE_BUFFER_MB)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr_lines = []
    while True:   # "Capturing on" comes before the interface is open (a second later with -B 256); "File:" after
        line = dumpcap.stderr.readline()
        if not line:
            raise RuntimeError(f"dumpcap exited before capturing: {''.join(stderr_lines)}")
        stderr_lines.append(line)
        if line.startswith("File:"):
            break
    try:
        outcome = drive(traffic, socks, (host, port), timeout=900)
    finally:
        time.sleep(0.5)   # let the last FIN/ACKs reach the ring buffer
        dumpcap.send_signal(signal.SIGINT)
        _, rest = dumpcap.communicate(timeout=60)
    stderr = "".join(stderr_lines) + rest
    packets, lost, stats = _dumpcap_stats(stderr)
    capture = Capture(traffic.kind, path, messages=traffic.messages, record_seconds=time.perf_counter() - started,
                      traffic_seconds=max(r["seconds"] for r in outcome), dumpcap_packets=packets,
                      dumpcap_dropped=lost, dumpcap_stats=stats, clients=outcome)
    for result in outcome:
        done = result.get("confirmed", result.get("delivered"))
        if done != traffic.messages or result.get("nacked"):
            raise RuntimeError(f"{traffic.kind}: {result} does not account for {traffic.messages} messages")
    if lost:
        raise IncompleteCapture(f"{traffic.kind}: dumpcap dropped packets ({stats}); the capture is not kept")
    problems = stream_holes(partial, expected_flows=2)
    if problems:
        raise IncompleteCapture(f"{traffic.kind}: the capture is not complete ({'; '.join(problems)}); it is not kept")
    os.replace(partial, path)
    with open(path + ".json", "w") as f:
        json.dump(asdict(capture), f, indent=1)
    return capture


def load_or_record(traffic: Traffic, out_dir: str, host: str, port: int, rerecord: bool) -> Capture:
    path = os.path.join(out_dir, f"{traffic.kind}.pcapng")
    if not rerecord and os.path.exists(path) and os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            capture = Capture(**json.load(f))
        capture.path, capture.reused = path, True
        return capture
    for attempt in range(1, RECORD_ATTEMPTS + 1):
        print(f"recording {traffic.kind}: {traffic.messages:,} messages ...", flush=True)
        try:
            return record(traffic, path, host, port)
        except IncompleteCapture as exc:
            if attempt == RECORD_ATTEMPTS:
                raise
            print(f"  {exc}; recording again", flush=True)


# -- reference counts (untimed) -------------------------------------------------------------------

@dataclass
class Reference:
    packets: int = 0
    segments: int = 0        # TCP segments carrying payload
    frames: int = 0          # AMQP frames tshark decoded
    flows: int = 0
    lost_segments: int = 0
    out_of_order: int = 0
    retransmissions: int = 0


# Loopback captures on more than one core can hold a segment before the one it follows (the copies
# reach the capture ring from different CPUs). tshark's default then loses AMQP frame sync for a
# while and undercounts (by 17% on a bulk capture here), so both tshark runs reassemble out of order.
TSHARK_PREFS = ["-o", "tcp.reassemble_out_of_order:TRUE"]


def tshark_reference(path: str) -> Reference:
    cmd = ["tshark", *TSHARK_PREFS, "-r", path, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,",
           "-e", "tcp.stream", "-e", "tcp.len", "-e", "amqp.type",
           "-e", "tcp.analysis.lost_segment", "-e", "tcp.analysis.ack_lost_segment",
           "-e", "tcp.analysis.out_of_order", "-e", "tcp.analysis.retransmission"]
    ref, streams = Reference(), set()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        for line in proc.stdout:
            stream, tcp_len, types, lost, ack_lost, out_of_order, retrans = line.rstrip("\n").split("\t")
            ref.packets += 1
            streams.add(stream)
            ref.segments += tcp_len not in ("", "0")
            ref.frames += types.count(",") + 1 if types else 0
            ref.lost_segments += bool(lost or ack_lost)
            ref.out_of_order += bool(out_of_order)
            ref.retransmissions += bool(retrans)
    ref.flows = len(streams - {""})
    return ref


# -- timing ---------------------------------------------------------------------------------------

_RSS_WRAPPER = ("import resource, subprocess, sys\n"
                "code = subprocess.call(sys.argv[2:], stdout=sys.stdout)\n"
                "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
                "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}')\n"
                "sys.exit(code)\n")


@dataclass
class Run:
    seconds: float
    rss_mb: float
    returncode: int
    stdout: str
    cpu_seconds: float = 0.0   # user + system of the child and everything it waited for


def timed(cmd: list[str], *, keep_stdout: bool) -> Run:
    """Wall time, CPU time and peak RSS of one child: GNU time -v if installed, else a getrusage wrapper."""
    with tempfile.NamedTemporaryFile(mode="r", suffix=".rss") as rss_file:
        if os.access(GNU_TIME, os.X_OK):
            full = [GNU_TIME, "-v", "-o", rss_file.name, *cmd]
        else:
            full = [sys.executable, "-c", _RSS_WRAPPER, rss_file.name, *cmd]
        stdout = subprocess.PIPE if keep_stdout else subprocess.DEVNULL
        started = time.perf_counter()
        proc = subprocess.run(full, stdout=stdout, stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - started
        report = rss_file.read()
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", report)
    if found:
        kbytes = int(found.group(1))
        cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", report))
    else:
        kbytes, cpu = (float(x) for x in (report.split() or ["0", "0"]))
    if proc.returncode not in (0,) and not keep_stdout:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return Run(seconds, kbytes / 1024, proc.returncode, proc.stdout or "", cpu)


def ackscope_cmd(path: str, lake_dir: str, workers: int | None) -> list[str]:
    cmd = [os.path.join(VENV_BIN, "ackscope"), "ingest", path, "--lake", lake_dir, "--json", "--no-progress"]
    return cmd + (["--workers", str(workers)] if workers is not None else [])


def run_ackscope(path: str, workers: int | None, tmp_root: str) -> tuple[Run, dict]:
    lake_dir = tempfile.mkdtemp(prefix="ackscope-bench-lake-", dir=tmp_root)
    try:
        run = timed(ackscope_cmd(path, lake_dir, workers), keep_stdout=True)
    finally:
        shutil.rmtree(lake_dir, ignore_errors=True)
    if run.returncode != 0:
        raise RuntimeError(f"ackscope ingest {path} exited {run.returncode}: {run.stdout[-1000:]}")
    result = json.loads(run.stdout)
    return run, result["files"][0] if "files" in result else result


def run_tshark(path: str) -> Run:
    return timed(["tshark", *TSHARK_PREFS, "-r", path, "-Y", "amqp", "-T", "fields", "-e", "amqp.method.method"], keep_stdout=False)


def best_of(runs: list[Run]) -> Run:
    best = min(runs, key=lambda r: r.seconds)
    return Run(best.seconds, max(r.rss_mb for r in runs), best.returncode, best.stdout, best.cpu_seconds)


@dataclass
class Result:
    capture: Capture
    ref: Reference
    ackscope: Run
    ackscope_json: dict
    tshark: Run
    holes: list[str]

    @property
    def ackscope_frames(self) -> int:
        return sum(self.ackscope_json["frames_by_method"].values())

    @property
    def ackscope_fps(self) -> float:
        return self.ackscope_frames / self.ackscope.seconds

    @property
    def tshark_fps(self) -> float:
        return self.ref.frames / self.tshark.seconds


def measure(capture: Capture, repeat: int, tmp_root: str) -> Result:
    ref = tshark_reference(capture.path)
    holes = stream_holes(capture.path, expected_flows=2)
    ackscope_runs, tshark_runs = [], []
    for _ in range(repeat):   # interleaved, so that a noisy neighbour hurts both tools alike
        ackscope_runs.append(run_ackscope(capture.path, None, tmp_root))
        tshark_runs.append(run_tshark(capture.path))
    _fastest, report = min(ackscope_runs, key=lambda pair: pair[0].seconds)
    return Result(capture, ref, best_of([run for run, _ in ackscope_runs]), report, best_of(tshark_runs), holes)


def workers_supported() -> bool:
    help_text = subprocess.run([os.path.join(VENV_BIN, "ackscope"), "ingest", "--help"],
                               capture_output=True, text=True).stdout
    return "--workers" in help_text


# -- output ---------------------------------------------------------------------------------------

def mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_captures(captures: list[Capture], results: list[Result]) -> None:
    print("\ncaptures")
    for capture, result in zip(captures, results):
        size = os.path.getsize(capture.path) / 1e6
        origin = "reused (--rerecord to record again)" if capture.reused else "recorded now"
        print(f"  {capture.kind:<6} {capture.path}  {size:,.1f} MB, {capture.messages:,} messages, {origin}; "
              f"recording took {capture.record_seconds:.1f} s (traffic {capture.traffic_seconds:.1f} s, "
              f"{capture.messages / max(capture.traffic_seconds, 1e-9):,.0f} msg/s)")
        print(f"         dumpcap: {capture.dumpcap_packets:,} packets, {capture.dumpcap_stats}")
        ref = result.ref
        checks = [f"tshark reads {ref.packets:,} packets " + ("(= dumpcap)" if ref.packets == capture.dumpcap_packets
                                                             else f"(dumpcap wrote {capture.dumpcap_packets:,}!)"),
                  "both flows run from SYN to FIN/RST with no byte missing" if not result.holes
                  else "INCOMPLETE: " + "; ".join(result.holes),
                  f"tshark marks {ref.lost_segments} lost, {ref.out_of_order} out-of-order and "
                  f"{ref.retransmissions} retransmitted segments"]
        print("         check: " + "; ".join(checks))
        report = result.ackscope_json
        if report.get("errors") or report.get("gaps") or report.get("damaged") or report.get("midstream_connections"):
            print(f"         ackscope reported: errors={report.get('errors')} gaps={report.get('gaps')} "
                  f"midstream connections={report.get('midstream_connections')} damaged={report.get('damaged')}")


def print_table(results: list[Result], repeat: int) -> None:
    header_row = ["file", "packets", "segments", "frames (ackscope)", "frames (tshark)", "frames/seg",
                  "ackscope s", "ackscope frames/s", "tshark s", "tshark frames/s", "ratio", "target",
                  "ackscope RSS MB", "target", "tshark RSS MB"]
    rows = []
    for r in results:
        target = TARGETS[r.capture.kind]
        ratio = r.ackscope_fps / r.tshark_fps
        same = "" if r.ackscope_frames == r.ref.frames else f" ({r.ackscope_frames - r.ref.frames:+,})"
        rows.append([r.capture.kind, f"{r.ackscope_json['packets']:,}", f"{r.ref.segments:,}",
                     f"{r.ackscope_frames:,}{same}", f"{r.ref.frames:,}", f"{r.ref.frames / max(r.ref.segments, 1):.2f}",
                     f"{r.ackscope.seconds:.2f}", f"{r.ackscope_fps:,.0f}", f"{r.tshark.seconds:.2f}",
                     f"{r.tshark_fps:,.0f}", f"{ratio:.2f}x", f"{mark(ratio >= target)} >={target:g}x",
                     f"{r.ackscope.rss_mb:,.0f}", f"{mark(r.ackscope.rss_mb < TARGET_RSS_MB)} <{TARGET_RSS_MB}",
                     f"{r.tshark.rss_mb:,.0f}"])
    widths = [max(len(row[i]) for row in rows + [header_row]) for i in range(len(header_row))]
    print(f"\ndecode speed, best of {repeat} wall-clock runs (ackscope: fresh lake per run, includes start-up "
          f"and Delta commit; tshark: -o tcp.reassemble_out_of_order:TRUE -Y amqp -T fields -e amqp.method.method "
          f"> /dev/null)")
    for row in [header_row, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    for r in results:
        inside = r.ackscope_json.get("seconds", 0.0)
        print(f"  {r.capture.kind}: ackscope spent {inside:.2f} s inside ingest_file (decode + Delta commit), "
              f"{r.ackscope.seconds - inside:.2f} s starting up; tshark frames/s counts what tshark decoded")
        if r.capture.kind == "bulk" and r.ref.frames < MIN_BULK_FRAMES:
            print(f"  note: bulk has {r.ref.frames:,} frames, fewer than {MIN_BULK_FRAMES:,}: raise --bulk-messages")


def print_workers(results: list[Result], workers: int | None, repeat: int, tmp_root: str) -> None:
    supported = workers_supported()
    if workers is None:
        print(f"\nworkers: not measured (pass --workers 2); ackscope ingest "
              f"{'supports' if supported else 'does not support'} --workers")
        return
    if not supported:
        print(f"\nworkers: skipped: `ackscope ingest --help` has no --workers option yet "
              f"(target: >={TARGET_WORKERS_SPEEDUP}x with --workers 2)")
        return
    print(f"\nworkers: --workers {workers} against --workers 1, best of {repeat}")
    for r in results:
        one = best_of([run_ackscope(r.capture.path, 1, tmp_root)[0] for _ in range(repeat)])
        many_runs = [run_ackscope(r.capture.path, workers, tmp_root) for _ in range(repeat)]
        many = best_of([run for run, _ in many_runs])
        frames = {sum(report["frames_by_method"].values()) for _, report in many_runs}
        if frames != {r.ackscope_frames}:
            print(f"  {r.capture.kind:<6} --workers {workers} decoded {sorted(frames)} frames, not {r.ackscope_frames:,}!")
        speedup = one.seconds / many.seconds
        target = f"  {mark(speedup >= TARGET_WORKERS_SPEEDUP)} >={TARGET_WORKERS_SPEEDUP}x" if workers == 2 else ""
        print(f"  {r.capture.kind:<6} 1 worker {one.seconds:.2f} s, {workers} workers {many.seconds:.2f} s: "
              f"speed-up {speedup:.2f}x{target}; peak RSS of the largest process {many.rss_mb:,.0f} MB "
              f"{mark(many.rss_mb < TARGET_RSS_MB)} <{TARGET_RSS_MB}")
        # One process already runs its Parquet encoding and fingerprint on threads beside the
        # decoding: the cores it keeps busy bound what any split of the same work can gain here.
        busy = one.cpu_seconds / one.seconds
        cores = min(workers, os.cpu_count() or 1)
        print(f"         CPU: 1 worker {one.cpu_seconds:.2f} s ({busy:.2f} cores busy on average), {workers} workers "
              f"{many.cpu_seconds:.2f} s; on {cores} cores no split of the same work can beat "
              f"{cores / busy:.2f}x")


def profile(capture: Capture, top: int = 25) -> None:
    sys.path.insert(0, REPO_DIR)
    from analyzer.ingest import decode

    profiler = cProfile.Profile()
    started = time.perf_counter()
    report, _connections = profiler.runcall(decode, capture.path, lambda rows: None)
    elapsed = time.perf_counter() - started
    frames = sum(report.frames_by_method.values())
    print(f"\nprofile: {capture.kind} ({capture.path}): decode() of {report.packets:,} packets, {frames:,} frames "
          f"in {elapsed:.1f} s under cProfile (no Delta writes); top {top} by tottime")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
    print("\n".join("  " + line for line in out.getvalue().strip().splitlines()[2:]))


# -- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "out"), metavar="DIR",
                        help="where captures are cached (default %(default)s)")
    parser.add_argument("--rerecord", action="store_true", help="record the captures again even if cached")
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="best of N timed runs (default %(default)s)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="also time ackscope ingest --workers N against --workers 1, if the CLI has it")
    parser.add_argument("--profile", action="store_true", help="profile ackscope's decode() in-process (cProfile)")
    parser.add_argument("--only", choices=["bulk", "chatty"], help="one capture instead of both")
    parser.add_argument("--bulk-messages", type=int, default=200_000, metavar="N",
                        help="messages in the bulk capture, about 6 frames each (default %(default)s)")
    parser.add_argument("--chatty-messages", type=int, default=30_000, metavar="N",
                        help="messages in the chatty capture, about 8 frames each (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--tmp", default=None, metavar="DIR", help="where the throw-away lakes go (default: system temp)")
    args = parser.parse_args(argv)

    for tool in ("dumpcap", "tshark"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (apt-get install tshark)")
    os.makedirs(args.out, exist_ok=True)
    kinds = [args.only] if args.only else ["chatty", "bulk"]
    traffic = {"bulk": Traffic("bulk", args.bulk_messages, body_size=100, window=5000, prefetch=1000, ack_every=100),
               "chatty": Traffic("chatty", args.chatty_messages, body_size=32, prefetch=1, ack_every=1)}

    captures = [load_or_record(traffic[kind], args.out, args.host, args.port, args.rerecord) for kind in kinds]
    results = []
    for capture in captures:
        print(f"timing {capture.kind} ...", flush=True)
        results.append(measure(capture, args.repeat, args.tmp))
    print_captures(captures, results)
    print_table(results, args.repeat)
    print_workers(results, args.workers, args.repeat, args.tmp)
    if args.profile:
        for capture in captures:
            profile(capture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
