"""The capture packets of the frames a run's findings name that are known without a scan of `frames`
(docs/analysis.md, "Incremental", Findings): a frame's packet never changes, a stored finding's
`source` is its first evidence frame's, and the run's new frames hold the rest of a finding that grew.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from itertools import zip_longest

import pyarrow as pa

from analyzer import schema

PACKETS = ["connection_id", "seq", "source_packet", "source"]
FRAME_KEYS = pa.schema([schema.FRAMES.field(name) for name in ("connection_id", "seq")])
Frame = tuple[str, int]   # (connection_id, seq)


def known_packets(named: Iterable[tuple[str, Sequence[int]]], stored: pa.Table | None,
                  frames: Iterable[pa.Table]) -> tuple[dict[Frame, tuple], set[Frame]]:
    """`named`: each finding's connection_id and evidence seqs; `stored`: the findings stored before
    the run; `frames`: the run's new frames. Out: the (packet, source) of the frames of every finding
    whose frames all have a packet so, and whose first has a source too; and the others' frames, to
    scan for (the scan gives all of theirs, with their source)."""
    named = {(connection_id, tuple(seqs)) for connection_id, seqs in named if seqs}
    wanted = {(connection_id, seq) for connection_id, seqs in named for seq in seqs}
    if not wanted:
        return {}, set()
    packets: dict[Frame, int] = {}
    sources: dict[Frame, str] = {}

    def seen(key: Frame, packet: int | None, source: str | None) -> None:
        # A frame's packet and source are facts: where two places have one, they are equal (max, as Spark).
        if packet is not None:
            packets[key] = max(packets.get(key, packet), packet)
        if source is not None:
            sources[key] = max(sources.get(key, source), source)

    for row in (stored.select(["connection_id", "source", "evidence"]).to_pylist() if stored is not None else []):
        evidence = json.loads(row["evidence"]) if row["evidence"] is not None else {}
        seqs, located = evidence.get("seqs"), evidence.get("source_packets")
        if not isinstance(seqs, list) or not isinstance(located, list):
            continue
        # Each packet's file where they are in several (source_files), else every one is in `source`.
        files = evidence.get("source_files")
        files = files if isinstance(files, list) else [row["source"]] * len(located)
        for pos, (seq, packet) in enumerate(zip_longest(seqs, located)):
            if packet is not None and (row["connection_id"], seq) in wanted:
                source = files[pos] if pos < len(files) and isinstance(files[pos], str) else None
                seen((row["connection_id"], seq), packet, source)
    for table in frames:
        for row in table.select(PACKETS).to_pylist():
            key = (row["connection_id"], row["seq"])
            if key in wanted:
                seen(key, row["source_packet"], row["source"])
    unknown = {(connection_id, seq) for connection_id, seqs in named
               if any((connection_id, seq) not in packets for seq in seqs) or (connection_id, seqs[0]) not in sources
               for seq in seqs}
    return {key: (packet, sources.get(key)) for key, packet in packets.items() if key not in unknown}, unknown

