"""Captures cut into pieces at packet boundaries, and a lake's tables as the whole capture would read.

`cut` writes a capture's packets into several nanosecond pcap files (record for record, the
bytes and times unchanged); `tables` reads a lake's frames and connections with each frame's
(source file, packet number) turned into its number in the whole capture, so a lake of pieces
and a lake of the whole compare row for row.
"""

from __future__ import annotations

import os
import struct

from analyzer import lake, schema
from analyzer.capture_file import read_packets


def cut(path: str, before: list[int], out_dir: str, stem: str = "piece") -> tuple[list[str], dict[str, int]]:
    """The capture's packets in files cut before the given packet indexes (0-based); the files and
    each file's packet offset in the whole."""
    packets = list(read_packets(path))
    linktype = packets[0][2]
    bounds = [0, *sorted(before), len(packets)]
    os.makedirs(out_dir, exist_ok=True)
    paths, offsets = [], {}
    for k in range(len(bounds) - 1):
        piece = os.path.join(out_dir, f"{stem}_{k:05d}.pcap")
        with open(piece, "wb") as f:
            f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, linktype))
            for _, ts, _, data in packets[bounds[k]:bounds[k + 1]]:
                f.write(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(data), len(data)) + data)
        paths.append(piece)
        offsets[piece] = bounds[k]
    return paths, offsets


def packet_count(path: str) -> int:
    return sum(1 for _ in read_packets(path))


def tables(lake_dir: str, offsets: dict[str, int] | None = None) -> tuple[list[dict], list[dict]]:
    """(frame rows by connection and seq, connection rows by id), with `source` dropped and
    `source_packet` numbered in the whole capture (`offsets`: file -> packets before it)."""
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES).to_pylist()
    for row in frames:
        if offsets is not None:
            row["source_packet"] += offsets[row["source"]]
        row["source"] = None
    frames.sort(key=lambda r: (r["connection_id"], r["seq"]))
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS).to_pylist()
    for row in connections:
        row["source"] = None
    connections.sort(key=lambda r: r["connection_id"])
    return frames, connections
