"""TLS decode benchmark: `ackscope ingest --tls-keylog` against `tshark -o tls.keylog_file` on a
capture of real amqps traffic.

The bulk traffic of bench/decode.py (a confirm-mode publisher with a window of 5000 outstanding
confirms, a prefetch-1000 consumer acking every 100 deliveries, AMQP over raw sockets) goes through
the test broker's TLS listener on 5671 (deploy/ci/services.sh), TLS 1.3 (AES-256-GCM) or TLS 1.2
(ECDHE-RSA-AES256-GCM-SHA384), each client writing the key log. The capture and its key log are
cached in bench/out/tls/. Both tools decode the file with the key log, best of N wall-clock runs,
interleaved; the table gives frames per second and ackscope's peak RSS against the goal.

    .venv/bin/python bench/tls.py [--messages 50000] [--version 1.3] [--repeat 3] [--rerecord]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode import (CAPTURE_BUFFER_MB, SNAPLEN, VENV_BIN, Run, Traffic, best_of, drive,  # noqa: E402
                    stream_holes, timed)

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
CA = "/var/lib/ackscope-test-tls/ca.pem"
TLS_PORT = 5671
TARGET = 3.0          # ackscope frames/s over tshark frames/s, same file, same key log
TARGET_RSS_MB = 500
TLS12_SUITE = "ECDHE-RSA-AES256-GCM-SHA384"


class TlsClientSocket:
    """A client socket bound before the capture starts (bench/decode.py's filter keeps everyone
    else out by port) that speaks TLS from connect() on: what decode.Wire needs of a socket."""

    def __init__(self, context: ssl.SSLContext):
        self.raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.raw.bind(("127.0.0.1", 0))
        self.context, self.tls = context, None

    def getsockname(self):
        return self.raw.getsockname()

    def connect(self, address) -> None:
        self.raw.connect(address)
        self.tls = self.context.wrap_socket(self.raw, server_hostname="localhost")

    def __getattr__(self, name):  # sendall, recv, setsockopt, fileno, ...: the TLS socket's
        return getattr(self.tls if self.tls is not None else self.raw, name)

    def close(self) -> None:
        (self.tls or self.raw).close()


def client_context(version: str, keylog: str) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=CA)
    context.minimum_version = context.maximum_version = (ssl.TLSVersion.TLSv1_3 if version == "1.3"
                                                         else ssl.TLSVersion.TLSv1_2)
    if version == "1.2":
        context.set_ciphers(TLS12_SUITE)
    context.keylog_filename = keylog
    return context


def record(path: str, keylog: str, traffic: Traffic, version: str) -> None:
    partial = path + ".recording"
    for stale in (partial, keylog):
        if os.path.exists(stale):
            os.remove(stale)
    os.close(os.open(keylog, os.O_CREAT | os.O_WRONLY, 0o600))
    socks = [TlsClientSocket(client_context(version, keylog)) for _ in range(2)]
    ours = " or ".join(f"tcp port {sock.getsockname()[1]}" for sock in socks)
    dumpcap = subprocess.Popen(["dumpcap", "-i", "lo", "-f", f"tcp port {TLS_PORT} and ({ours})", "-w", partial,
                                "-s", str(SNAPLEN), "-B", str(CAPTURE_BUFFER_MB)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not dumpcap.stderr.readline().startswith("File:"):
        if dumpcap.poll() is not None:
            raise RuntimeError("dumpcap exited before capturing")
    try:
        drive(traffic, socks, ("127.0.0.1", TLS_PORT), timeout=900)
    finally:
        time.sleep(0.5)
        dumpcap.send_signal(signal.SIGINT)
        dumpcap.communicate(timeout=60)
    holes = stream_holes(partial, expected_flows=2)
    if holes:
        raise RuntimeError(f"the capture is not complete: {'; '.join(holes)}")
    os.replace(partial, path)


def tshark_frames(path: str, keylog: str) -> int:
    """AMQP frames of every type (methods, content headers and bodies, heartbeats) tshark decrypts."""
    out = subprocess.run(tshark_cmd(path, keylog, ["-e", "amqp.type", "-E", "occurrence=a", "-E", "aggregator=,"]),
                         capture_output=True, text=True, check=True).stdout
    return sum(len(line.split(",")) for line in out.splitlines() if line)


def tshark_cmd(path: str, keylog: str, fields: list[str]) -> list[str]:
    return ["tshark", "-o", "tcp.reassemble_out_of_order:TRUE", "-o", f"tls.keylog_file:{keylog}",
            "-r", path, "-Y", "amqp", "-T", "fields", *fields]


def run_ackscope(path: str, keylog: str, tmp_root: str) -> tuple[Run, dict]:
    lake_dir = tempfile.mkdtemp(prefix="ackscope-bench-tls-", dir=tmp_root)
    try:
        run = timed([os.path.join(VENV_BIN, "ackscope"), "ingest", path, "--lake", lake_dir, "--tls-keylog", keylog,
                     "--json", "--no-progress"], keep_stdout=True)
    finally:
        shutil.rmtree(lake_dir, ignore_errors=True)
    if run.returncode != 0:
        raise RuntimeError(f"ackscope ingest exited {run.returncode}")
    return run, json.loads(run.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--version", choices=("1.2", "1.3"), default="1.3")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rerecord", action="store_true")
    args = parser.parse_args(argv)
    out_dir = os.path.join(BENCH_DIR, "out", "tls")  # apart: tests/test_native_lane.py reads bench/out/*.pcapng
    os.makedirs(out_dir, exist_ok=True)
    name = f"tls{args.version.replace('.', '')}-bulk-{args.messages}"
    path, keylog = os.path.join(out_dir, f"{name}.pcapng"), os.path.join(out_dir, f"{name}.keys.log")
    if args.rerecord or not (os.path.exists(path) and os.path.exists(keylog)):
        print(f"recording {name}: {args.messages:,} messages over TLS {args.version} ...", flush=True)
        record(path, keylog, Traffic("bulk", args.messages, 64, window=5000, prefetch=1000, ack_every=100),
               args.version)
    reference = tshark_frames(path, keylog)
    ackscope_runs, tshark_runs = [], []
    with tempfile.TemporaryDirectory() as tmp_root:
        for _ in range(args.repeat):  # interleaved: a noisy neighbour hurts both alike
            ackscope_runs.append(run_ackscope(path, keylog, tmp_root))
            tshark_runs.append(timed(tshark_cmd(path, keylog, ["-e", "amqp.method.method"]), keep_stdout=False))
    ackscope, report = min(ackscope_runs, key=lambda pair: pair[0].seconds)
    ackscope = best_of([run for run, _ in ackscope_runs])
    tshark = best_of(tshark_runs)
    frames = sum(report["frames_by_method"].values())
    assert report["tls_not_decrypted"] == {} and report["tls_connections"] == 2, report
    ratio = (frames / ackscope.seconds) / (reference / tshark.seconds)
    # CPU seconds too: on a shared machine the wall clock measures the neighbours as much as the tools.
    cpu_ratio = (frames / min(r.cpu_seconds for r, _ in ackscope_runs)) / (reference / min(r.cpu_seconds for r in tshark_runs))
    print(f"{name}: {os.path.getsize(path) / 1e6:.1f} MB, {frames:,} frames (tshark {reference:,}"
          f"{'' if frames == reference else ', NOT EQUAL'}), best of {args.repeat}, load {os.getloadavg()[0]:.1f}")
    print(f"  ackscope ingest --tls-keylog   {ackscope.seconds:7.2f} s  {frames / ackscope.seconds:>10,.0f} frames/s  "
          f"cpu {min(r.cpu_seconds for r, _ in ackscope_runs):6.2f} s  peak RSS {ackscope.rss_mb:.0f} MB (goal <= {TARGET_RSS_MB})")
    print(f"  tshark -o tls.keylog_file      {tshark.seconds:7.2f} s  {reference / tshark.seconds:>10,.0f} frames/s  "
          f"cpu {min(r.cpu_seconds for r in tshark_runs):6.2f} s")
    print(f"  ratio {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU (goal >= {TARGET:.0f}x): {'ok' if ratio >= TARGET else 'BELOW GOAL'}")
    return 0 if frames == reference else 1


if __name__ == "__main__":
    sys.exit(main())
