"""`ackscope ingest`: capture files -> decoded frame events -> the `frames` and `connections` Delta tables.

The files of one call are one capture (pieces.py): read in the order of their first packets, a
flow going on across their boundaries; the open flows at its end are saved in the lake per capture
source (flow_lake.py) for the next ingest of that source to continue. Each file is fingerprinted
(SHA-256 of its bytes); the fingerprints are the Delta app transaction ids of the capture's commits
(one per table: frames, connections, flow_state, in that order), so a file already in the lake is
skipped, and a run cut short between two commits is completed by the next run without duplicating
anything.
"""

import concurrent.futures
import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from . import flow_lake, lake, schema
from .capture_file import PCAPNG_MAGIC, CaptureFileError, interface_name
from .fingerprint import fingerprint
from .flow_lake import TABLE, SourceState
from .flows import DEFAULT_BROKER_PORTS
from .framing import DEFAULT_MAX_FRAME
from .gcpause import cyclic_gc_paused
from .pieces import GAP, OVERLAP, Capture, apart, first_packet_ts, seconds
from .rows import dicts_to_table
from .spec import DEFAULT_CONTINUE_WITHIN_S
from .terminal import NAME_LIMIT, printable
from .worker_pool import worker_pool



@dataclass
class FileReport:
    file: str
    sha256: str = ""
    packets: int = 0
    flows: int = 0
    amqp_connections: int = 0
    midstream_connections: int = 0
    unsupported: Counter = field(default_factory=Counter)
    tls_connections: int = 0    # amqps: decrypted ones are AMQP connections too
    tls_not_decrypted: Counter = field(default_factory=Counter)  # why (schema.CONNECTIONS tls_note) -> connections
    frames_by_method: Counter = field(default_factory=Counter)
    gaps: int = 0
    rows: int = 0
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the file joined the capture (pieces.py, flow_lake.py)
    damaged: bool = False       # truncated or corrupt: what came before the damage was kept
    unreadable: bool = False    # not a capture at all: nothing was ingested
    skipped: bool = False       # already in the lake
    frames_version: int | None = None
    seconds: float = 0.0
    source: str = ""            # the capture source its flows are saved under (--source)
    first_ts_ns: int | None = None
    last_ts_ns: int | None = None
    continued_connections: int = 0  # open flows of an earlier ingest this one continued
    committed_with: str | None = None  # the capture's last file, whose report counts the rows of all

    def as_json(self) -> dict:
        return {
            "file": self.file, "sha256": self.sha256, "packets": self.packets, "flows": self.flows,
            "amqp_connections": self.amqp_connections, "midstream_connections": self.midstream_connections,
            "unsupported_flows": sum(self.unsupported.values()), "unsupported_protocols": dict(self.unsupported),
            "tls_connections": self.tls_connections, "tls_not_decrypted": dict(self.tls_not_decrypted),
            "frames_by_method": dict(sorted(self.frames_by_method.items())), "gaps": self.gaps,
            "rows": self.rows, "errors": self.errors, "notes": self.notes, "damaged": self.damaged,
            "unreadable": self.unreadable, "skipped": self.skipped, "frames_version": self.frames_version,
            "seconds": round(self.seconds, 3), "source": self.source, "first_ts_ns": self.first_ts_ns,
            "last_ts_ns": self.last_ts_ns, "continued_connections": self.continued_connections,
        }


def decode(path: str, on_batch, *, agent_id: str = "", broker_ports=DEFAULT_BROKER_PORTS,
           max_frame: int = DEFAULT_MAX_FRAME, progress=None, shard: tuple[int, int] = (0, 1), tls_keylog=None
           ) -> tuple[FileReport, list[dict]]:
    """Decode one capture file on its own; frame rows go to `on_batch(arrow_table)` in batches of
    schema.FRAMES. Returns the report and the connection rows. Damage in the file ends the read but
    keeps everything decoded before it; a failure inside one flow drops that flow only. `tls_keylog`
    (tls.KeyLog): the secrets amqps connections are decrypted with."""
    report = FileReport(path)
    with cyclic_gc_paused():  # a batch's rows live until it becomes Arrow; the collector would keep walking them
        capture = Capture(on_batch, agent_id=agent_id, broker_ports=broker_ports, max_frame=max_frame, shard=shard,
                          tls_keylog=tls_keylog)
        capture.read(path, None, report, 0, progress)
        connection_rows, _, provisional, _, _ = capture.close(report.notes)
        if provisional is not None:
            on_batch(provisional)
    count_connections([report], connection_rows)
    return report, connection_rows


def count_connections(reports: list[FileReport], connection_rows: list[dict]) -> None:
    """Each connection counted in the report of the file it was first seen in (one that began in an
    earlier ingest: the first file's, as continued)."""
    spans = [(r.first_ts_ns, r.last_ts_ns, r) for r in reports if r.first_ts_ns is not None]
    for row in connection_rows:
        first = row["first_ts_ns"]
        report = next((r for lo, hi, r in spans if lo <= first <= (hi if hi is not None else lo)), reports[0])
        if spans and first < spans[0][0]:
            report.continued_connections += 1
            continue
        report.flows += 1
        protocol = row["protocol"]
        if row["tls_version"] is not None or protocol == "tls":
            report.tls_connections += 1
            if not row["tls_decrypted"]:
                report.tls_not_decrypted[row["tls_note"]] += 1
                continue
        if protocol == "amqp-0-9-1":
            report.amqp_connections += 1
            report.midstream_connections += not row["started_at_syn"]
        elif protocol != "none":
            report.unsupported[protocol] += 1


def connections_table(connection_rows: list[dict]):
    return dicts_to_table(connection_rows, schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS,
                          schema.CONNECTION_DATE_FROM)


def ingest_file(path: str, lake_dir: str, **options) -> FileReport:
    """`ingest_files` of one file."""
    return ingest_files([path], lake_dir, **options)[0]


@dataclass
class _Piece:
    report: FileReport
    app_id: str
    first_ts_ns: int | None


def ingest_files(paths: list[str], lake_dir: str, *, source: str | None = None,
                 continue_within_s: float = DEFAULT_CONTINUE_WITHIN_S, agent_id: str = "",
                 broker_ports=DEFAULT_BROKER_PORTS, max_frame: int = DEFAULT_MAX_FRAME, show_progress: bool = False,
                 workers: int = 1, pool=None, fingerprint_of=fingerprint, tls_keylog=None) -> list[FileReport]:
    """Decode capture files into the lake as one capture (pieces.py), continuing the open flows the
    lake saved for their capture source (flow_lake.py) when the first file follows them within
    `continue_within_s`. Files already in the lake are skipped; the rest land in one commit per
    table carrying every file's app transaction id. Reports come in the order the files were read
    (their first packets' times). `fingerprint_of(path)` gives a file's SHA-256
    (fingerprint.Fingerprints: computed while this process was starting). With several `workers`,
    `pool` is worker_pool(workers) when the caller has one; else one is started for this call."""
    started = time.perf_counter()
    done, pieces = [], []
    seen: dict[str, str] = {}
    ingested = _Ingested(lake_dir)
    for path in dict.fromkeys(paths):
        piece = _plan_file(path, ingested, fingerprint_of, seen)
        if piece.report.skipped or piece.report.unreadable:
            piece.report.seconds = time.perf_counter() - started
            done.append(piece.report)
        else:
            pieces.append(piece)
    if not pieces:
        return done
    in_time = sorted(pieces, key=lambda p: (p.first_ts_ns is None, p.first_ts_ns or 0, p.report.file))
    notes = in_time[0].report.notes
    if [p.report.file for p in in_time] != [p.report.file for p in pieces]:
        notes.append("files read in the order of their first packets: "
                     + ", ".join(os.path.basename(p.report.file) for p in in_time))
    source = source or default_source(in_time[0].report.file)
    with (worker_pool(workers) if pool is None and workers > 1 else contextlib.nullcontext(pool)) as pool:
        _ingest_run(in_time, lake_dir, source, int(continue_within_s * 1e9), workers if pool is not None else 1,
                    pool, dict(agent_id=agent_id, broker_ports=broker_ports, max_frame=max_frame, tls_keylog=tls_keylog),
                    show_progress)
    in_time[-1].report.seconds = time.perf_counter() - started  # the capture's time, with its rows
    return done + [p.report for p in in_time]


class _Ingested:
    """Is a file's app id committed to frames and connections? Each table opened once, not once per file."""

    def __init__(self, lake_dir: str):
        self.tables = [lake.open_table(lake_dir, name) for name in ("frames", "connections")]

    def __call__(self, app_id: str) -> bool:
        return all(table is not None and table.transaction_version(app_id) is not None for table in self.tables)


def _plan_file(path: str, ingested: _Ingested, fingerprint_of, seen: dict[str, str]) -> _Piece:
    report = FileReport(path)
    try:
        report.sha256 = fingerprint_of(path)
    except OSError as exc:
        report.unreadable = True
        report.errors.append(f"{path}: cannot read: {exc.strerror}")
        return _Piece(report, "", None)
    app_id = f"ackscope-ingest-{report.sha256}"
    if report.sha256 in seen:
        report.skipped = True
        report.notes.append(f"{path}: the same bytes as {seen[report.sha256]}: read once")
        return _Piece(report, app_id, None)
    seen[report.sha256] = path
    if ingested(app_id):
        report.skipped = True
        return _Piece(report, app_id, None)
    try:
        first_ts = first_packet_ts(path)
    except CaptureFileError as exc:
        if not exc.damaged:
            report.unreadable = True
            report.errors.append(str(exc))
            return _Piece(report, app_id, None)
        first_ts = None  # damaged before its first packet was whole: the read reports it
    return _Piece(report, app_id, first_ts)


def default_source(path: str) -> str:
    """The capture source a file's flows are saved under when --source is not given: its capture
    interface's name, as a pcapng file's first interface (IDB if_name) records it, else the folder
    the file is in (a ring's files share one)."""
    name = interface_name(path)
    if name:
        return f"interface:{name}"
    return f"folder:{os.path.dirname(os.path.abspath(path))}"


def _ingest_run(pieces: list[_Piece], lake_dir: str, source: str, continue_within_ns: int, workers: int, pool,
                options: dict, show_progress: bool) -> None:
    reports = [p.report for p in pieces]
    notes = reports[0].notes
    app_ids = [p.app_id for p in pieces]
    need = {name: not lake.committed(lake_dir, name, app_ids[0]) for name in ("frames", "connections", TABLE)}
    state = flow_lake.load(lake_dir, source, notes)
    restore, removed = _continuation(state, pieces, lake_dir, source, continue_within_ns, need, notes)
    tag = f"{lake.PROVISIONAL_PREFIX}-{pieces[-1].report.sha256[:16]}"
    frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    provisional_frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    run = dict(files=[(p.report.file, p.first_ts_ns) for p in pieces], lake_dir=lake_dir, restore=restore,
               source=source, continue_within_ns=continue_within_ns, need_frames=need["frames"], options=options,
               tag=tag)
    if pool is not None and workers > 1:
        others = pool.starmap_async(_decode_shard, [(run, (k, workers), False) for k in range(1, workers)])
        results = [_decode_shard(run, (0, workers), show_progress)] + others.get()
    else:
        results = [_decode_shard(run, (0, 1), show_progress)]
    connection_rows, saved, still_open, ended = [], [], set(), set()
    for k, (shard_reports, rows, shard_saved, shard_open, shard_ended, files, frame_rows, p_files, p_rows
            ) in enumerate(results):
        frames.adopt(files, frame_rows)
        provisional_frames.adopt(p_files, p_rows)
        connection_rows += rows
        saved += shard_saved
        still_open |= shard_open
        ended.update(shard_ended)  # every worker remembers the flows restored as ended: once
        for report, shard_report in zip(reports, shard_reports):
            _merge(report, shard_report, first=k == 0)
    for report in reports:
        report.source = source
        report.errors = list(dict.fromkeys(report.errors))  # damage to a file is reported by every worker: once
    count_connections(reports, connection_rows)
    if all(r.unreadable for r in reports):
        return
    last = max((r for r in reports if r.last_ts_ns is not None), key=lambda r: r.last_ts_ns, default=None)
    metadata = {"ackscope.source": ",".join(r.file for r in reports), "ackscope.capture_source": source,
                "ackscope.sha256": ",".join(r.sha256 for r in reports), "ackscope.agent_id": options["agent_id"],
                "ackscope.packets": sum(r.packets for r in reports)}
    provisional = {"frames": [a.path for a in provisional_frames.actions], "connections": []}
    if need["frames"]:
        frames.adopt(provisional_frames.files(), provisional_frames.rows)
        version = frames.commit(app_ids, metadata, remove=removed["frames"])
        for report in reports:
            report.frames_version = version
    else:  # committed by a run cut short before its other commits: its provisional files are named by its tag
        provisional["frames"] = lake.files_named(lake_dir, "frames", tag)
    reports[-1].rows = frames.rows  # one commit for the whole capture: its rows on its last file's report
    for report in reports[:-1]:
        report.committed_with = reports[-1].file
    provisional_connections = lake.TableWriter(lake_dir, "connections", schema.CONNECTIONS, prefix=tag)
    if need["connections"]:
        connections = lake.TableWriter(lake_dir, "connections", schema.CONNECTIONS)
        connections.write(connections_table([r for r in connection_rows if r["connection_id"] not in still_open]))
        provisional_connections.write(connections_table([r for r in connection_rows
                                                         if r["connection_id"] in still_open]))
        connections.adopt(provisional_connections.files(), provisional_connections.rows)
        connections.commit(app_ids, metadata, remove=removed["connections"])
        provisional["connections"] = [a.path for a in provisional_connections.actions]
    else:
        provisional["connections"] = lake.files_named(lake_dir, "connections", tag)
    if need[TABLE] and last is not None and (state is None or last.last_ts_ns >= state.last_ts_ns):
        flow_lake.save(lake_dir, source, SourceState(last.last_ts_ns, last.file, sorted(saved), provisional,
                                                     sorted(ended)),
                       app_ids, metadata)


def _continuation(state, pieces, lake_dir: str, source: str, continue_within_ns: int, need: dict, notes: list
                  ) -> tuple[tuple | None, dict]:
    """What this capture continues ((the saved flows, the flows that ended near the end), None: it
    does not) and the provisional files its commits take out of each table."""
    nothing = {"frames": [], "connections": []}
    if state is None:
        return None, nothing
    first = pieces[0]
    held = f"source {source!r} holds a capture up to {state.last_file}"
    if first.first_ts_ns is None:
        return None, nothing
    why = apart(state.last_ts_ns, first.first_ts_ns, continue_within_ns)
    if why == OVERLAP:
        notes.append(f"{first.report.file}: starts {seconds(state.last_ts_ns - first.first_ts_ns)} before what {held} "
                     f"ends (out of order, or overlapping): read as a capture of its own; the source's saved "
                     f"flows are kept for the file that follows them")
        return None, nothing
    if why == GAP:
        notes.append(f"{first.report.file}: starts {seconds(first.first_ts_ns - state.last_ts_ns)} after what {held} "
                     f"ends, more than --continue-within {seconds(continue_within_ns)}: the "
                     f"{len(state.flows)} flow(s) open then ended there")
        return None, nothing
    for name in ("frames", "connections"):
        if need[name] and not lake.has_files(lake_dir, name, state.provisional.get(name, [])):
            notes.append(f"{first.report.file}: the rows that ended {source!r}'s open flows in {name} were "
                         f"rewritten since (compacted?): its flows are not continued")
            return None, nothing
    if state.flows:
        notes.append(f"{first.report.file}: continues the {len(state.flows)} open flow(s) saved for source "
                     f"{source!r} at the end of {state.last_file}")
    return (state.flows, state.ended), {name: paths if need[name] else [] for name, paths in state.provisional.items()}


def _merge(report: FileReport, shard: FileReport, first: bool) -> None:
    """A worker's report of a file into the file's report (the first worker's is the base)."""
    if first:
        for name in ("packets", "damaged", "unreadable", "first_ts_ns", "last_ts_ns"):
            setattr(report, name, getattr(shard, name))
        report.notes += shard.notes
    report.errors += shard.errors
    report.frames_by_method.update(shard.frames_by_method)
    report.gaps += shard.gaps


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


def _decode_shard(run: dict, shard: tuple[int, int], show_progress: bool):
    """One worker: decode the flows of its shard of the whole capture, write their Parquet files
    (frames, and apart the rows the open flows' ending made), commit nothing. With several workers
    each reads every file but decodes only its own flows (FlowTable's shard)."""
    lake_dir = run["lake_dir"]
    frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    reports = [FileReport(path) for path, _ in run["files"]]
    with cyclic_gc_paused(), _WriteBehind(frames.write if run["need_frames"] else _discard) as write:
        capture = Capture(write, shard=shard, **run["options"])
        if run["restore"] is not None:
            capture.restore(*run["restore"], run["files"][0][0], reports[0].notes)
        for (path, first_ts), report in zip(run["files"], reports):
            progress = _Progress(path) if show_progress else None
            capture.read(path, first_ts, report, run["continue_within_ns"], progress)
            if progress is not None:
                progress.done()
        connection_rows, saved, provisional, still_open, ended = capture.close(reports[-1].notes)
    provisional_frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES, prefix=run["tag"])
    if provisional is not None and run["need_frames"]:
        provisional_frames.write(provisional)
    return (reports, connection_rows, saved, still_open, ended, frames.files(), frames.rows,
            provisional_frames.files(), provisional_frames.rows)


class _Progress:
    """A progress bar on stderr, for people watching a long file. Packet bytes read plus their record
    headers, against the file's size, give the fraction."""

    WIDTH = 30

    def __init__(self, path: str):
        self.name = printable(os.path.basename(path), NAME_LIMIT)
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
