"""The reference decoder: what tshark (Wireshark's dissector) sees in a capture."""

import shutil
import subprocess
from collections import Counter

from analyzer.spec import METHODS

FRAME_TYPE_NAMES = {"2": "content.header", "3": "content.body", "8": "heartbeat"}
FRAME_FIELDS = ["-e", "amqp.type", "-e", "amqp.method.class", "-e", "amqp.method.method"]


def tshark_path() -> str:
    path = shutil.which("tshark")
    if path is None:
        raise RuntimeError("tshark is not installed: run `make test` (deploy/ci/services.sh installs it)")
    return path


def frames_by_method(capture: str, decode_as_ports: tuple[int, ...] = (), tls_keylog: str | None = None) -> Counter:
    """Count AMQP 0-9-1 frames per method (and content header/body, heartbeat) as tshark decodes them;
    amqps with `tls_keylog` (the NSS key log tshark decrypts with)."""
    counts: Counter = Counter()
    for fields in _fields(capture, [], decode_as_ports, tls_keylog):
        _count_frames(counts, *fields)
    return counts


def frames_by_client_port(capture: str, broker_port: int) -> dict[int, Counter]:
    """frames_by_method by the client's port of the connection they travel on, for a broker (or a
    relay) listening on `broker_port`."""
    by_port: dict[int, Counter] = {}
    for sport, dport, *fields in _fields(capture, ["-e", "tcp.srcport", "-e", "tcp.dstport"], (broker_port,)):
        port = int(dport) if int(sport) == broker_port else int(sport)
        _count_frames(by_port.setdefault(port, Counter()), *fields)
    return by_port


def _fields(capture: str, leading: list[str], decode_as_ports, tls_keylog: str | None = None) -> list[list[str]]:
    """Per AMQP packet: the `leading` fields, then the frame types, class ids and method ids (comma-joined)."""
    command = [tshark_path(), "-r", capture, "-Y", "amqp", "-T", "fields", *leading, *FRAME_FIELDS,
               "-E", "occurrence=a", "-E", "aggregator=,"]
    if tls_keylog is not None:
        command += ["-o", f"tls.keylog_file:{tls_keylog}"]
    for port in decode_as_ports:
        command += ["-d", f"tcp.port=={port},amqp"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 and "cut short" not in result.stderr:  # tshark reads truncated files up to the damage
        raise RuntimeError(f"tshark failed on {capture}: {result.stderr.strip()}")
    width = len(leading) // 2 + 3
    return [(line.split("\t") + [""] * width)[:width] for line in result.stdout.splitlines()]


def _count_frames(counts: Counter, types: str, classes: str, methods: str) -> None:
    class_ids = iter(classes.split(",") if classes else [])
    method_ids = iter(methods.split(",") if methods else [])
    for frame_type in types.split(","):
        if frame_type == "1":
            counts[METHODS[(int(next(class_ids)), int(next(method_ids)))]] += 1
        elif frame_type in FRAME_TYPE_NAMES:
            counts[FRAME_TYPE_NAMES[frame_type]] += 1
