"""`ackscope ingest`: capture files -> decoded frame events -> the `frames` and `connections` Delta tables.

Each file is fingerprinted (SHA-256 of its bytes); the fingerprint is the Delta app transaction
id of its commits, so a file already in the lake is skipped, and a run cut short between the two
tables' commits is completed by the next run without duplicating anything.
"""

import concurrent.futures
import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from . import lake, native, schema
from .rows import RowSink, dicts_to_table
from .capture_file import PCAPNG_MAGIC, CaptureFileError, read_packets
from .fingerprint import fingerprint
from .flows import DEFAULT_BROKER_PORTS, FlowTable
from .framing import DEFAULT_MAX_FRAME
from .gcpause import cyclic_gc_paused
from .packets import SUPPORTED_LINKTYPES, tcp_segment
from .worker_pool import worker_pool

BATCH_ROWS = 100_000


@dataclass
class FileReport:
    file: str
    sha256: str = ""
    packets: int = 0
    flows: int = 0
    amqp_connections: int = 0
    midstream_connections: int = 0
    unsupported: Counter = field(default_factory=Counter)
    frames_by_method: Counter = field(default_factory=Counter)
    gaps: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)
    damaged: bool = False       # truncated or corrupt: what came before the damage was kept
    unreadable: bool = False    # not a capture at all: nothing was ingested
    skipped: bool = False       # already in the lake
    frames_version: int | None = None
    seconds: float = 0.0

    def as_json(self) -> dict:
        return {
            "file": self.file, "sha256": self.sha256, "packets": self.packets, "flows": self.flows,
            "amqp_connections": self.amqp_connections, "midstream_connections": self.midstream_connections,
            "unsupported_flows": sum(self.unsupported.values()), "unsupported_protocols": dict(self.unsupported),
            "frames_by_method": dict(sorted(self.frames_by_method.items())), "gaps": self.gaps,
            "rows": self.rows, "errors": self.errors, "damaged": self.damaged, "unreadable": self.unreadable,
            "skipped": self.skipped, "frames_version": self.frames_version, "seconds": round(self.seconds, 3),
        }


def decode(path: str, on_batch, *, agent_id: str = "", broker_ports=DEFAULT_BROKER_PORTS,
           max_frame: int = DEFAULT_MAX_FRAME, progress=None, shard: tuple[int, int] = (0, 1)
           ) -> tuple[FileReport, list[dict]]:
    """Decode one capture file; frame rows go to `on_batch(arrow_table)` in batches of schema.FRAMES.

    Returns the report and the connection rows. Damage in the file ends the read but keeps
    everything decoded before it; a failure inside one flow drops that flow only.
    """
    report = FileReport(path)
    rows = RowSink()
    counts: dict = {}
    flows = FlowTable(sink=rows, counts=counts, errors=report.errors, source=path, agent_id=agent_id,
                      broker_ports=broker_ports, max_frame=max_frame, shard=shard)
    # The usual packets are decoded in C where the extension is built (native.py); the rest here.
    lane = native.lane_for(flows)
    deliver = lane.packet if lane is not None else flows.packet
    seen_linktypes: set[int] = set()
    packets = 0
    captured_bytes = 0  # packet bytes read so far: the progress bar's measure of how far into the file
    # A batch's rows live until it becomes Arrow; the collector would keep walking them (gcpause).
    with cyclic_gc_paused():
        try:
            for number, ts_ns, linktype, data in read_packets(path, lane):
                packets = number
                if linktype is None:  # packets up to `number` taken by the native lane; `data` is their size
                    captured_bytes += data
                else:
                    captured_bytes += len(data)
                    if linktype not in seen_linktypes:
                        seen_linktypes.add(linktype)
                        if linktype not in SUPPORTED_LINKTYPES:
                            report.errors.append(f"{path}: packet {number}: link type {linktype} is not "
                                                 f"supported; its packets are skipped")
                    segment = tcp_segment(linktype, data)
                    if segment is not None:
                        deliver(number, ts_ns, segment)
                if not number & 0x3FF:  # the lane stops at every multiple of 1024 packets too  # checked every 1024 packets: cheap, and batches stay near BATCH_ROWS
                    if len(rows) >= BATCH_ROWS:
                        on_batch(rows.take())
                    if progress is not None and not number & 0x3FFF:
                        progress(number, captured_bytes)
        except CaptureFileError as exc:
            report.errors.append(str(exc))
            report.damaged = exc.damaged
            report.unreadable = not exc.damaged
        if lane is not None:
            lane.finish()
        flows.finish()
        if len(rows):
            on_batch(rows.take())
    report.packets = packets
    connection_rows = [conn.connection_row() for conn in flows.connections]
    report.flows = len(connection_rows)
    for row in connection_rows:
        protocol = row["protocol"]
        if protocol == "amqp-0-9-1":
            report.amqp_connections += 1
            report.midstream_connections += not row["started_at_syn"]
        elif protocol != "none":
            report.unsupported[protocol] += 1
    report.gaps = counts.pop("gaps", 0)
    report.frames_by_method.update(counts)
    return report, connection_rows


def connections_table(connection_rows: list[dict]):
    return dicts_to_table(connection_rows, schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS,
                          schema.CONNECTION_DATE_FROM)


def ingest_file(path: str, lake_dir: str, *, agent_id: str = "", broker_ports=DEFAULT_BROKER_PORTS,
                max_frame: int = DEFAULT_MAX_FRAME, show_progress: bool = False, workers: int = 1, pool=None,
                fingerprint_of=fingerprint) -> FileReport:
    """Decode one capture file into the lake. `fingerprint_of(path)` gives the file's SHA-256
    (fingerprint.Fingerprints: one computed while this process was starting). With several
    `workers`, `pool` is worker_pool(workers) when the caller has one (started early, kept for
    every file); else one is started for this file."""
    started = time.perf_counter()
    with (worker_pool(workers) if pool is None else contextlib.nullcontext(pool)) as pool:
        return _ingest_file(path, lake_dir, started, workers, pool, agent_id=agent_id, broker_ports=broker_ports,
                            max_frame=max_frame, show_progress=show_progress, fingerprint_of=fingerprint_of)


def _ingest_file(path: str, lake_dir: str, started: float, workers: int, pool, *, agent_id: str, broker_ports,
                 max_frame: int, show_progress: bool, fingerprint_of) -> FileReport:
    try:
        sha = fingerprint_of(path)
    except OSError as exc:
        report = FileReport(path, unreadable=True)
        report.errors.append(f"{path}: cannot read: {exc.strerror}")
        return report
    app_id = f"ackscope-ingest-{sha}"
    need_frames = not lake.committed(lake_dir, "frames", app_id)
    need_connections = not lake.committed(lake_dir, "connections", app_id)
    if not (need_frames or need_connections):
        report = FileReport(path, sha256=sha, skipped=True)
        report.seconds = time.perf_counter() - started
        return report

    frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    options = dict(agent_id=agent_id, broker_ports=broker_ports, max_frame=max_frame)
    if pool is not None:
        report, connection_rows = _decode_in_workers(path, frames, need_frames, pool, workers, options)
    else:
        progress = _Progress(path) if show_progress else None
        with _WriteBehind(frames.write if need_frames else _discard) as write:
            report, connection_rows = decode(path, write, progress=progress, **options)
        if progress is not None:
            progress.done()
    report.sha256 = sha
    if report.unreadable:
        report.seconds = time.perf_counter() - started
        return report
    metadata = {"ackscope.source": path, "ackscope.sha256": sha, "ackscope.agent_id": agent_id,
                "ackscope.packets": report.packets}
    if need_frames:
        report.frames_version = frames.commit(app_id, metadata)
    report.rows = frames.rows
    if need_connections:
        connections = lake.TableWriter(lake_dir, "connections", schema.CONNECTIONS)
        connections.write(connections_table(connection_rows))
        connections.commit(app_id, metadata)
    report.seconds = time.perf_counter() - started
    return report


def _discard(batch) -> None:
    pass


class _WriteBehind:
    """Hands each batch to `write` on a thread of its own. Parquet encoding and zstd run in pyarrow's
    C++ without the GIL, so they overlap the decoding of the next batch instead of pausing it. One
    batch at most waits to be written (memory stays bounded); a failed write raises at the next
    batch or on leaving the `with`, so nothing is committed after it."""

    def __init__(self, write):
        self._write = write
        self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ackscope-write")
        self._writing = None

    def __call__(self, batch) -> None:
        if self._writing is not None:
            self._writing.result()
        self._writing = self._thread.submit(self._write, batch)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            if self._writing is not None:
                self._writing.result()
        finally:
            self._thread.shutdown()


def _decode_shard(path: str, lake_dir: str, need_frames: bool, shard: tuple[int, int], options: dict):
    """One worker: decode the flows of its shard, write their Parquet files, commit nothing."""
    frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    with _WriteBehind(frames.write if need_frames else _discard) as write:
        report, connection_rows = decode(path, write, shard=shard, **options)
    return report, connection_rows, frames.files(), frames.rows


def _decode_in_workers(path: str, frames: lake.TableWriter, need_frames: bool, pool, workers: int, options: dict):
    """Flows are split across processes (see FlowTable's shard); each reads the whole file but decodes
    only its own flows. This process takes the first share itself (one interpreter start-up fewer,
    and its share starts at once) and commits every share's files in one transaction."""
    lake_dir = os.path.dirname(frames.path)
    others = pool.starmap_async(_decode_shard, [(path, lake_dir, need_frames, (k, workers), options)
                                                for k in range(1, workers)])
    results = [_decode_shard(path, lake_dir, need_frames, (0, workers), options)] + others.get()
    report = results[0][0]
    connection_rows = []
    errors = []
    for shard_report, rows, files, frame_rows in results:
        frames.adopt(files, frame_rows)
        connection_rows += rows
        errors += shard_report.errors
        if shard_report is not report:
            report.frames_by_method.update(shard_report.frames_by_method)
            report.unsupported.update(shard_report.unsupported)
            report.gaps += shard_report.gaps
            report.flows += shard_report.flows
            report.amqp_connections += shard_report.amqp_connections
            report.midstream_connections += shard_report.midstream_connections
    report.errors = list(dict.fromkeys(errors))  # damage to the file is reported by every worker: once is enough
    return report, connection_rows


class _Progress:
    """A progress bar on stderr, for people watching a long file. Packet bytes read plus their record
    headers, against the file's size, give the fraction."""

    WIDTH = 30

    def __init__(self, path: str):
        self.name = os.path.basename(path)
        self.size = max(os.path.getsize(path), 1)
        with open(path, "rb") as f:
            self.overhead = 34 if f.read(4) == PCAPNG_MAGIC else 16  # pcapng: 32-byte block + padding
        self.started = time.perf_counter()

    def __call__(self, packets: int, captured_bytes: int) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        fraction = min((captured_bytes + self.overhead * packets) / self.size, 1.0)
        filled = int(fraction * self.WIDTH)
        sys.stderr.write(f"\r{self.name} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {fraction:4.0%} "
                         f"{packets:,} packets, {packets / elapsed:,.0f}/s ")
        sys.stderr.flush()

    def done(self) -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
