"""The reference decoder: what tshark (Wireshark's dissector) sees in a capture."""

import shutil
import subprocess
from collections import Counter

from analyzer.spec import METHODS

FRAME_TYPE_NAMES = {"2": "content.header", "3": "content.body", "8": "heartbeat"}


def tshark_path() -> str:
    path = shutil.which("tshark")
    if path is None:
        raise RuntimeError("tshark is not installed: run `make test` (deploy/ci/services.sh installs it)")
    return path


def frames_by_method(capture: str, decode_as_ports: tuple[int, ...] = ()) -> Counter:
    """Count AMQP 0-9-1 frames per method (and content header/body, heartbeat) as tshark decodes them."""
    command = [tshark_path(), "-r", capture, "-Y", "amqp", "-T", "fields", "-e", "amqp.type",
               "-e", "amqp.method.class", "-e", "amqp.method.method", "-E", "occurrence=a", "-E", "aggregator=,"]
    for port in decode_as_ports:
        command += ["-d", f"tcp.port=={port},amqp"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 and "cut short" not in result.stderr:  # tshark reads truncated files up to the damage
        raise RuntimeError(f"tshark failed on {capture}: {result.stderr.strip()}")
    out = result.stdout
    counts: Counter = Counter()
    for line in out.splitlines():
        types, classes, methods = (line.split("\t") + ["", ""])[:3]
        class_ids = iter(classes.split(",") if classes else [])
        method_ids = iter(methods.split(",") if methods else [])
        for frame_type in types.split(","):
            if frame_type == "1":
                counts[METHODS[(int(next(class_ids)), int(next(method_ids)))]] += 1
            elif frame_type in FRAME_TYPE_NAMES:
                counts[FRAME_TYPE_NAMES[frame_type]] += 1
    return counts
