"""`ackscope capture`: the live agent's main loop and its two helper threads.

Main thread: capture -> decode -> state machine, every few hundred milliseconds handing the rows
to the sink's buffer. Sink thread: one flush per interval, compaction now and then; a slow or
failing lake never stalls the capture. HTTP thread: /metrics, /healthz, /readyz.
SIGTERM/SIGINT end the loop: what the kernel still holds is read, every connection is ended as at
the end of a file, and a last flush commits everything before the exit.

An internal error (a bug of ours, not a bad flow: FlowTable stops a bad flow alone) ends the loop
too, and the agent's decode state is no longer trusted: /readyz and one log line say so, the rows
already converted (consistent, each placed under its connection) are flushed, nothing more is
decoded or ended, and `run` raises AgentFailed so the process exits non-zero for its supervisor to
restart it. A row the sink cannot place (rows.UnplacedRow) is never written.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector

from .. import labels
from ..spec import DEFAULT_BROKER_PORTS, DEFAULT_MAX_FRAME
from .capture import DEFAULT_BUFFER_BYTES, LiveCapture
from .decoder import DEFAULT_IDLE_TIMEOUT_S, LiveDecoder, connection_rows_table
from .http import serve
from .keylog_file import KeyLogFile
from .live_state import LiveState
from .metrics import AgentCollector
from .pcap_out import RotatingPcapng
from .sink import (DEFAULT_COMPACT_MIN_AGE_S, DEFAULT_MAX_BUFFERED_ROWS, DEFAULT_RETENTION_HOURS, LakeSink,
                   check_retention)

TICK_S = 0.25           # rows reach the state machine (and the gauges) at least this often
STATS_EVERY_S = 1.0     # kernel drop counters are read this often
TRIM_EVERY_S = 2.0      # freed heap returned to the system this often (see release_freed_memory)
STALLED_AFTER_S = 5.0   # /readyz: the capture loop turns at least every TICK_S; this long means stuck
FAILING_FLUSHES = 3     # /readyz: this many failed flushes in a row is a failing sink, not a blip
log = logging.getLogger("ackscope.agent")


class AgentFailed(RuntimeError):
    """The agent met an internal error and stopped after flushing what it held that was consistent;
    `report` is its exit report."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def _malloc_trim():
    try:
        import ctypes
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_TRIM = _malloc_trim()


def release_freed_memory() -> None:
    """Give the heap pages freed since the last call back to the system. Each tick allocates Arrow
    buffers and row dicts and frees most of them again, between objects that live on (open
    channels); glibc keeps the holes. Measured with bench/capture.py (3,000 connections): 109 MB of
    peak RSS without, 38 MB with a trim every batch."""
    if _TRIM is not None:
        _TRIM(0)


@dataclass
class AgentConfig:
    iface: str
    lake: str
    ports: tuple = tuple(sorted(DEFAULT_BROKER_PORTS))
    agent_id: str = ""
    metrics_addr: tuple[str, int] | None = None
    flush_interval_s: float = 10.0
    compact_interval_s: float = 3600.0
    compact_min_age_s: float = DEFAULT_COMPACT_MIN_AGE_S
    retention_hours: float = DEFAULT_RETENTION_HOURS
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_buffered_rows: int = DEFAULT_MAX_BUFFERED_ROWS
    max_applications: int = labels.DEFAULT_MAX_APPLICATIONS
    max_vhosts: int = labels.DEFAULT_MAX_VHOSTS
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    max_frame: int = DEFAULT_MAX_FRAME
    pcap_out: str | None = None
    pcap_keep_credentials: bool = False
    rotate_bytes: int = 100 << 20
    rotate_keep: int = 10
    tls_keylog: str | None = None  # followed as it grows (keylog_file.py)


class Agent:
    def __init__(self, config: AgentConfig):
        check_retention(config.retention_hours)
        self.config = config
        self.agent_id = config.agent_id or socket.gethostname()
        self.source = f"live:{config.iface}@{self.agent_id}"
        self.keylog = KeyLogFile(config.tls_keylog) if config.tls_keylog else None  # refused before capturing
        self.capture = LiveCapture(config.iface, config.ports, config.buffer_bytes)
        self.decoder = LiveDecoder(source=self.source, agent_id=self.agent_id, broker_ports=config.ports,
                                   linktype=self.capture.linktype, max_frame=config.max_frame,
                                   idle_timeout_s=config.idle_timeout_s,
                                   keylog=self.keylog.keylog if self.keylog else None)
        self.state = LiveState(labels.SeriesCaps(config.max_applications, config.max_vhosts))
        self.sink = LakeSink(config.lake, self.agent_id, max_buffered_rows=config.max_buffered_rows,
                             retention_hours=config.retention_hours)
        self.pcap = (RotatingPcapng(config.pcap_out, self.capture.linktype, config.iface,
                                    rotate_bytes=config.rotate_bytes, keep=config.rotate_keep,
                                    keep_credentials=config.pcap_keep_credentials)
                     if config.pcap_out else None)
        self.stopping = threading.Event()
        self.failure: str | None = None  # an internal error's description: the agent is stopping for a restart
        self.started = time.monotonic()
        self.last_loop = time.monotonic()
        self._flush_wanted = threading.Event()
        self._sink_thread = None
        self.server = None
        if config.metrics_addr is not None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(AgentCollector(self))
            ProcessCollector(registry=registry)  # process_resident_memory_bytes, ..._cpu_seconds_total
            self.server = serve(config.metrics_addr, registry, self.ready)

    # -- what the metrics and probes read (under state.lock) ---------------------------------------

    def health(self) -> dict:
        counters = self.capture.counters
        sink = self.sink
        with sink.lock:
            flushes, dropped = dict(sink.flushes), dict(sink.rows_dropped)
            last_flush = sink.last_flush_ts
        return {
            "packets": counters.packets, "bytes": counters.bytes, "kernel_drops": counters.kernel_drops,
            "errors": self.decoder.error_count, "gaps": self.decoder.gaps(),
            "frames_by_method": self.decoder.frames_by_method(), "unsupported": dict(self.decoder.unsupported),
            "tls_connections": self.decoder.tls_connections, "tls_not_decrypted": self.decoder.tls_not_decrypted,
            "buffered_rows": sink.buffered_rows(), "flushes": flushes, "rows_dropped": dropped,
            "flush_histogram": sink.flush_histogram(), "last_flush_ts": last_flush,
        }

    def ready(self) -> tuple[bool, str]:
        if self.failure is not None:
            return False, f"internal error, exiting to be restarted: {self.failure}"
        now = time.monotonic()
        if now - self.last_loop > STALLED_AFTER_S:
            return False, f"capture loop stalled for {now - self.last_loop:.0f}s"
        grace = 3 * self.config.flush_interval_s + 30.0
        with self.sink.lock:
            last_flush, error, failing = self.sink.last_flush_ts, self.sink.last_error, self.sink.failing
        if failing >= FAILING_FLUSHES:
            return False, f"the last {failing} flushes to the lake failed: {error}"
        if last_flush is None:
            if now - self.started > grace:
                return False, f"no successful flush yet: {error or 'none attempted'}"
            return True, "capturing; first flush pending"
        if time.time() - last_flush > grace:
            return False, f"last successful flush {time.time() - last_flush:.0f}s ago: {error}"
        return True, "capturing and flushing"

    # -- the loop ------------------------------------------------------------------------------------

    def run(self) -> dict:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._sink_thread = threading.Thread(target=self._sink_loop, name="ackscope-sink", daemon=True)
        self._sink_thread.start()
        started = time.perf_counter()
        try:
            self._capture_loop()
        except Exception as exc:  # not a flow's input (FlowTable keeps those to their flow): a bug of ours
            self._fail(exc)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        report = self._shut_down(started)
        if self.failure is not None:
            raise AgentFailed(self.failure, report)
        return report

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = f"{type(exc).__name__}: {exc}"
            log.error("internal error, flushing what is consistent and exiting to be restarted: %s", self.failure)
        self.stopping.set()

    def _on_signal(self, signum, frame) -> None:
        self.stopping.set()

    def _capture_loop(self) -> None:
        next_tick = next_stats = next_trim = time.monotonic()
        read, packets_in = self.capture.read, self.decoder.packets_in
        while not self.stopping.is_set():
            batch = read(TICK_S / 2)
            if batch:
                with self.state.lock:  # a scrape reads the decoder's counters
                    packets_in(batch)
                if self.pcap is not None:
                    self.pcap.write(batch)
            now = time.monotonic()
            self.last_loop = now
            if now >= next_tick:
                next_tick = now + TICK_S
                self._tick()
            if now >= next_stats:
                next_stats = now + STATS_EVERY_S
                self.capture.read_stats()
            if now >= next_trim:
                next_trim = now + TRIM_EVERY_S
                release_freed_memory()

    def _tick(self, end_all: bool = False) -> None:
        if self.keylog is not None:
            self.keylog.poll()  # keys the application wrote since: held TLS records are decrypted in take()
        with self.state.lock:
            frames, rows, connection_rows, ended_ids = self.decoder.take(end_all=end_all)
            self.state.feed(rows, ended_ids, self.decoder.connection_facts())
        self.sink.add("frames", frames)
        if connection_rows:
            self.sink.add("connections", connection_rows_table(connection_rows))

    def _sink_loop(self) -> None:
        """A flush starts every interval from the start of the last one, not from its end: what a
        SIGKILL loses is then at most the rows of one interval, the flush under way and one tick
        (docs/agent.md, "Durability"; tests/test_agent_kill.py measures it)."""
        interval = self.config.flush_interval_s
        next_compaction = time.monotonic() + self.config.compact_interval_s
        next_flush = time.monotonic() + interval
        try:
            while not self.stopping.wait(max(0.0, next_flush - time.monotonic())):
                next_flush = max(next_flush + interval, time.monotonic())
                self.sink.flush({"ackscope.source": self.source})
                if time.monotonic() >= next_compaction:
                    next_compaction = time.monotonic() + self.config.compact_interval_s
                    self.sink.compact(self.config.compact_min_age_s)
        except Exception as exc:  # flush and compact keep the lake's own failures: this is ours
            self._fail(exc)

    def _shut_down(self, started: float) -> dict:
        """After a signal: what the kernel still queued was captured before it, so it is read, and
        every connection is ended. After an internal error (`failure`): the rows already handed to
        the sink are whole and placed, but what the decoder and the state machine hold is not
        trusted, so nothing more is decoded or ended (the connections still open get no row: the
        restarted agent sees them again mid-stream)."""
        if self.failure is None:
            while True:
                batch = self.capture.read(0)
                if not batch:
                    break
                with self.state.lock:
                    self.decoder.packets_in(batch)
                if self.pcap is not None:
                    self.pcap.write(batch)
            self.capture.read_stats()
            self._tick(end_all=True)
            with self.state.lock:
                self.state.end_of_data()
        if self._sink_thread is not None:
            self._sink_thread.join()  # a flush under way ends first: flushes never overlap
        self.sink.flush({"ackscope.source": self.source})
        if self.pcap is not None:
            self.pcap.close()
        self.capture.close()
        if self.server is not None:
            self.server.shutdown()
        report = self.report(time.perf_counter() - started)
        return report if self.failure is None else {**report, "internal_error": self.failure}

    def report(self, seconds: float) -> dict:
        d = self.decoder
        counters = self.capture.counters
        return {
            "source": self.source, "agent_id": self.agent_id, "packets": counters.packets,
            "bytes": counters.bytes, "flows": d.flows_seen, "frames_by_method": d.frames_by_method(),
            "gaps": d.gaps(), "unsupported_flows": sum(d.unsupported.values()),
            "unsupported_protocols": dict(d.unsupported), "errors": d.kept_errors, "error_count": d.error_count,
            "tls_connections": d.tls_connections, "tls_not_decrypted": d.tls_not_decrypted,
            "kernel_drops": counters.kernel_drops, "flushes": dict(self.sink.flushes),
            "rows_dropped": dict(self.sink.rows_dropped), "pcap_files": self.pcap.files if self.pcap else [],
            "seconds": round(seconds, 3),
        }
