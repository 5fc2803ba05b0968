"""Synthetic `frames` and `connections` Delta tables at any scale, for bench/analyze.py.

Real captures of 10 million frames with one channel of millions of deliveries take hours to
record, so the analysis benchmark makes its lake here instead: valid AMQP 0-9-1 traffic written
the way `ackscope ingest` writes it (exact `schema.FRAMES` rows, the field set the decoder gives
each method, Delta commits through `analyzer.lake.TableWriter`, partitioned by `date`).

Shape (sizes scale with `--frames`; figures for the default 10 M):
- One hot connection with one consumer channel of `--hot-deliveries` deliveries (3 M) and their
  acks (single and multiple), with a few nack/reject requeues and their redeliveries.
- About 250 more connections, each with 2-7 channel numbers; a number is closed and opened again
  up to three times, which makes ~1,700 channel incarnations. Each incarnation is one of: confirm
  publisher (batched multiple confirms, single ones, a few out of order, rare nacks followed by a
  republish, mandatory publishes with an occasional basic.return), plain publisher, consumer with
  basic.qos (single and multiple acks, nack/reject with and without requeue, redeliveries),
  consumer without qos, auto-ack consumer, dead-letter-queue consumer (x-death headers), RPC
  client (direct reply-to), publisher and consumer on one channel, basic.get poller, and a
  passive queue.declare the broker refuses with 404.
- Connections open with the protocol header, start/tune/open, send heartbeats, sometimes get
  connection.blocked/unblocked, and close with connection.close and TCP FINs; one in ten is still
  open when the data ends (its last deliveries and publishes stay `open`). One consumer
  incarnation in ten is closed with deliveries unacked: they come back, redelivered, on the next
  incarnation of that channel number.
- The capture window (an hour by default) crosses midnight UTC: two `date` partitions, and
  channels that span both.

Vectorised: per channel incarnation, numpy makes every stream at once (arrival times as cumulative
sums of exponential gaps, delivery tags, ack and confirm groups as cut points, settle times kept
rising with a running maximum, redelivery targets by searchsorted), a connection's streams are
merged with one lexsort, and its rows become Arrow columns directly (strings as codes into one
vocabulary, body hashes and identities hex-encoded from integer hashes of a message number, so a
redelivered or republished message keeps its identity). Only the few control frames per
incarnation (open, qos, consume, close, ...) are Python dicts, and those come from
`analyzer.methods.fields_from_pamqp` on real pamqp method objects, so they carry exactly the
fields the decoder would give them. Connections are generated and written one by one, so memory
stays bounded by the hot connection.

Valid: `analyzer.timeline.replay_frames` (the reference model) finds no violation, and the
deliveries' and publishes' outcomes it derives are the ones counted here
(`tests/test_bench_generator.py` checks that at small scale). What is not real: bodies do not
exist (body_hash and the hash identities are hashes of a message number, not of bytes), and the
connection table's byte and frame counters are estimates.

    .venv/bin/python bench/frames_generator.py --lake DIR [--frames 10000000] [--hot-deliveries 3000000] [--seed 1]
        [--quiet]   # no nack, reject, dead-lettering or channel closed with deliveries unacked
    .venv/bin/python bench/frames_generator.py --verify [--frames ...]   # the reference model over all of it
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pamqp import commands as amqp

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
if REPO_DIR not in sys.path:
    sys.path.insert(0, REPO_DIR)

from analyzer import lake, schema, spec  # noqa: E402
from analyzer.ingest import connections_table  # noqa: E402
from analyzer.methods import fields_from_pamqp  # noqa: E402

# Bump when the generated data changes: it is part of the cache key.
GENERATOR_VERSION = 2

MS, US, S = 1_000_000, 1_000, 1_000_000_000
INT_NULL = np.iinfo(np.int64).min
TO_BROKER, TO_CLIENT = 0, 1
DIRECTIONS = pa.array(["to_broker", "to_client"])
HEARTBEAT_S = 60
WRITE_ROWS = 1_000_000           # rows per Parquet write (a file per date partition in it)
SLICE_ROWS = 500_000             # rows made into Arrow at a time
FRAMES_PER_CONNECTION = 24_000   # sets the number of connections: ~250 for 10 M frames

# Incarnation kinds and how often each is picked.
KINDS = {
    "publisher_confirm": 0.35, "publisher_plain": 0.06, "consumer": 0.33, "consumer_unbounded": 0.03,
    "consumer_auto": 0.06, "consumer_dlq": 0.03, "rpc": 0.06, "getter": 0.04, "pubsub": 0.02,
    "failed_declare": 0.02,
}
CONSUMER_KINDS = {"consumer", "consumer_unbounded", "consumer_auto", "consumer_dlq", "pubsub"}
# Body frames per message, used to turn a frame budget into message counts.
# (Confirms come in groups of ~18, acks in groups of ~3.6; rpc, pubsub: half publishes, half deliveries.)
FRAMES_PER_MESSAGE = {"publisher_confirm": 1.06, "publisher_plain": 1.0, "consumer": 1.28, "consumer_unbounded": 1.28,
                      "consumer_auto": 1.0, "consumer_dlq": 1.71, "rpc": 1.0, "getter": 2.8, "pubsub": 1.17,
                      "failed_declare": 1.0}
MAX_GETS = 3_000  # basic.get polling is slow: a poller does not get a big share

CLIENTS = [("pika", "1.3.2", "Python 3.11.9"), ("RabbitMQ Java Client", "5.21.0", "Java"),
           ("aio-pika", "9.4.1", "Python 3.12.3"), ("RabbitMQ .NET Client", "6.8.1", ".NET"),
           ("amqplib", "0.10.4", "Node.JS v20.11.1"), ("py-amqp", "5.2.0", "Python 3.10.14")]
APPS = ["orders", "billing", "inventory", "shipping", "notifications", "audit", "search-indexer", "payments"]
BROKERS = [("10.0.0.11", "rabbit@mq-0"), ("10.0.0.12", "rabbit@mq-1"), ("10.0.0.13", "rabbit@mq-2")]

_FRAME_TYPES = {f.name: f.type for f in schema.FRAMES}
# Columns filled per connection, not per row.
CONSTANT_COLUMNS = ("connection_id", "agent_id", "client_addr", "client_port", "server_addr", "server_port", "source")
# Columns derived from the message number `msg` when finishing a connection.
MESSAGE_COLUMNS = ("message_id", "body_hash", "message_identity", "body_size", "content_complete", "correlation_id")


def _kind(name: str) -> str:
    t = _FRAME_TYPES[name]
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t):
        return "int"
    return "code"  # strings: codes into the vocabulary


COLUMN_KIND = {name: _kind(name) for name in _FRAME_TYPES
               if name not in ("date", "ts", "ts_ns", "seq") + CONSTANT_COLUMNS + MESSAGE_COLUMNS}
COLUMN_KIND.update(_t="int", _i="int", msg="int", corr="bool", direction="dir", method="code")
FILL = {"int": INT_NULL, "bool": -1, "code": -1, "dir": 0}
DTYPE = {"int": np.int64, "bool": np.int8, "code": np.int32, "dir": np.int8}


@dataclass(frozen=True)
class Params:
    frames: int = 10_000_000
    hot_deliveries: int = 3_000_000
    seed: int = 1
    connections: int | None = None          # default: from frames
    duration_s: int = 3600
    midnight: str = "2026-03-15T00:00:00+00:00"  # the window crosses this midnight UTC, 2/3 of the way in:
                                                  # two date partitions, channels living in both
    commits: int = 3                          # Delta commits per table
    quiet: bool = False                       # no requeue or dead-lettering, no channel closed with deliveries
                                              # unacked: nothing the message kinds read (most lakes' traffic)

    def key(self) -> str:
        conns = "auto" if self.connections is None else self.connections
        return (f"f{self.frames}-h{self.hot_deliveries}-s{self.seed}-c{conns}-d{self.duration_s}"
                f"-v{GENERATOR_VERSION}" + ("-quiet" if self.quiet else ""))


# -- small vectorised helpers --------------------------------------------------------------------

def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64: a well-spread 64-bit hash of each integer."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def hex_strings(words: list[np.ndarray], prefix: bytes = b"") -> pa.StringArray:
    """Fixed-width strings `prefix` + hex of the given uint64 words, built straight into Arrow buffers."""
    n = len(words[0])
    raw = np.ascontiguousarray(np.stack([w.astype(">u8") for w in words], axis=1)).view(np.uint8).reshape(n, -1)
    width = len(prefix) + 2 * raw.shape[1]
    out = np.empty((n, width), np.uint8)
    out[:, :len(prefix)] = np.frombuffer(prefix, np.uint8)
    out[:, len(prefix)::2] = _HEX[raw >> 4]
    out[:, len(prefix) + 1::2] = _HEX[raw & 15]
    offsets = np.arange(0, width * (n + 1), width, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out))


def bursts(rng, start: int, span: int, ends: np.ndarray, intra_gap: float) -> np.ndarray:
    """Strictly rising times in [start, start + span] for messages sent in bursts (the groups cut
    at `ends`): `intra_gap` apart within a burst, bursts spread over the span, the last at its end.
    Clients publish (and brokers deliver) in bursts; that is what makes multiple acks and confirms."""
    n = int(ends[-1]) + 1
    gaps = rng.exponential(intra_gap, n)
    firsts = np.concatenate([[0], ends[:-1] + 1])
    gaps[firsts] = rng.exponential(max(span / len(ends), 1.0), len(ends))
    cum = np.cumsum(np.maximum(gaps, 1.0))
    return rising(start + (cum * (span / cum[-1])).astype(np.int64))


def rising(x: np.ndarray, step: int = 1) -> np.ndarray:
    """The smallest sequence >= x that rises by at least `step` each element."""
    ramp = step * np.arange(len(x), dtype=np.int64)
    return np.maximum.accumulate(x - ramp) + ramp


def group_ends(rng, n: int, p_single: float, max_size: int) -> np.ndarray:
    """Cut 0..n-1 into consecutive groups (size 1 with p_single, else 2..max_size): each group's last index."""
    if n == 0:
        return np.zeros(0, np.int64)
    sizes = np.where(rng.random(n) < p_single, 1, rng.integers(2, max(max_size, 2) + 1, n))
    ends = np.cumsum(sizes) - 1
    ends = ends[ends < n - 1]
    return np.append(ends, n - 1).astype(np.int64)


def later_slots(rng, times: np.ndarray, after: np.ndarray, forbidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each time in `after`, a slot a little later in `times` (a redelivery or a republish):
    (which of `after`, slot). Slots are distinct and never in `forbidden`."""
    if len(after) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    slots = np.searchsorted(times, after, side="right") + rng.integers(0, 4, len(after))
    which = np.arange(len(after))
    ok = (slots < len(times)) & ~np.isin(slots, forbidden)
    which, slots = which[ok], slots[ok]
    slots, first = np.unique(slots, return_index=True)
    return which[first], slots


class Vocab:
    """Every string column value as a small integer code; one Arrow array of them per connection."""

    def __init__(self):
        self.codes: dict[str, int] = {}
        self.values: list[str] = []
        self._array = None

    def __call__(self, value: str | None) -> int:
        if value is None:
            return -1
        code = self.codes.get(value)
        if code is None:
            code = self.codes[value] = len(self.values)
            self.values.append(value)
        return code

    def array(self) -> pa.Array:
        if self._array is None or len(self._array) != len(self.values):
            self._array = pa.array(self.values, pa.string())
        return self._array


# -- one connection's frames ---------------------------------------------------------------------

class ConnectionFrames:
    """A connection's frames while they are made: vectorised blocks and a few control rows, each
    with a time `_t` (ns from the window start) and an insertion number `_i` that orders ties."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.blocks: list[dict] = []
        self.controls: list[tuple] = []
        self.inserted = 0

    def block(self, t, direction: int, channel: int, method, **columns) -> None:
        t = np.asarray(t, np.int64)
        n = len(t)
        if n == 0:
            return
        cols = {"_t": t, "_i": self.inserted + np.arange(n, dtype=np.int64),
                "direction": np.full(n, direction, np.int8), "channel": np.full(n, channel, np.int64)}
        self.inserted += n
        columns["method"] = method
        for name, value in columns.items():
            if value is None:
                continue
            kind = COLUMN_KIND[name]
            if isinstance(value, str):
                value = self.vocab(value)
            arr = np.asarray(value)
            if kind == "bool":
                arr = arr.astype(np.int8)
            cols[name] = np.broadcast_to(arr.astype(DTYPE[kind], copy=False), (n,))
        self.blocks.append(cols)

    def control(self, t: int, direction: int, channel: int, command=None, **fields) -> dict:
        """One row: a pamqp method object (its fields as the decoder takes them) or a pseudo-row."""
        row = fields_from_pamqp(spec.METHOD_NAMES[command.index], command) if command is not None else {}
        row.update(fields)
        self.controls.append((int(t), direction, channel, self.inserted, row))
        self.inserted += 1
        return row  # still mutable: a basic.qos learns its prefetch once the deliveries are made

    def _controls_block(self) -> dict | None:
        if not self.controls:
            return None
        n = len(self.controls)
        cols = {"_t": np.array([c[0] for c in self.controls], np.int64),
                "direction": np.array([c[1] for c in self.controls], np.int8),
                "channel": np.array([c[2] for c in self.controls], np.int64),
                "_i": np.array([c[3] for c in self.controls], np.int64)}
        names = {k for c in self.controls for k in c[4]}
        for name in names:
            kind = COLUMN_KIND[name]
            values = [c[4].get(name) for c in self.controls]
            if kind == "code":
                arr = np.array([self.vocab(v) for v in values], np.int32)
            elif kind == "bool":
                arr = np.array([-1 if v is None else int(bool(v)) for v in values], np.int8)
            else:
                arr = np.array([INT_NULL if v is None else int(v) for v in values], np.int64)
            cols[name] = arr
        assert all(len(v) == n for v in cols.values())
        return cols

    def finish(self, t0_ns: int, constants: dict, packet_base: int) -> "Finished":
        """Merge the streams into seq order; rows come out as schema.FRAMES tables of SLICE_ROWS."""
        blocks = self.blocks + [b for b in [self._controls_block()] if b is not None]
        self.blocks, self.controls = [], []
        names = sorted({k for b in blocks for k in b} - {"_t", "_i"})

        def column(name):
            kind = COLUMN_KIND[name]
            return np.concatenate([b[name] if name in b else np.full(len(b["_t"]), FILL[kind], DTYPE[kind])
                                   for b in blocks])

        t = column("_t")
        order = np.lexsort((column("_i"), column("channel"), t))
        t = t[order]
        cols = {name: column(name)[order] for name in names}   # one column at a time: bounded memory
        del blocks, order
        return Finished(self.vocab, t0_ns, t, cols, constants, packet_base)


class Finished:
    """One connection's rows in seq order, as numpy columns; `tables()` turns them into Arrow a
    slice at a time, so a connection of millions of rows never exists as Arrow all at once."""

    def __init__(self, vocab: Vocab, t0_ns: int, t: np.ndarray, cols: dict, constants: dict, packet_base: int):
        self.vocab, self.t0_ns, self.t, self.cols, self.constants = vocab, t0_ns, t, cols, constants
        self.n = len(t)
        # Frames sharing a timestamp came in one packet.
        self.packet = packet_base + np.cumsum(np.diff(t, prepend=-1) != 0)
        codes, counts = np.unique(cols["method"], return_counts=True)
        self.methods = {vocab.values[c]: int(k) for c, k in zip(codes, counts)}

    def tables(self):
        for lo in range(0, self.n, SLICE_ROWS):
            yield self._slice(lo, min(self.n, lo + SLICE_ROWS))

    def _slice(self, lo: int, hi: int) -> pa.Table:
        n = hi - lo
        vocab = self.vocab.array()
        out: dict[str, pa.Array] = {}
        for name, full in self.cols.items():
            if name in ("msg", "corr"):
                continue
            kind, arr = COLUMN_KIND[name], full[lo:hi]
            if name == "direction":
                out[name] = DIRECTIONS.take(pa.array(arr))
            elif kind == "code":
                out[name] = vocab.take(pa.array(arr, mask=arr < 0))
            elif kind == "bool":
                out[name] = pa.array(arr == 1, mask=arr < 0)
            else:
                out[name] = pa.array(arr, _FRAME_TYPES[name], mask=arr == INT_NULL)
        ts_ns = self.t0_ns + self.t[lo:hi]
        out["ts_ns"] = pa.array(ts_ns)
        ts = pa.array(ts_ns // 1000).cast(pa.timestamp("us", tz="UTC"))
        out["ts"] = ts
        out["date"] = ts.cast(pa.date32()).cast(pa.string())
        out["seq"] = pa.array(np.arange(lo + 1, hi + 1, dtype=np.int64))
        out["source_packet"] = pa.array(self.packet[lo:hi])
        for name in CONSTANT_COLUMNS:
            out[name] = pa.repeat(pa.scalar(self.constants[name], _FRAME_TYPES[name]), n)
        if "msg" in self.cols:
            corr = self.cols.get("corr")
            out.update(message_columns(self.cols["msg"][lo:hi], None if corr is None else corr[lo:hi]))
        return pa.Table.from_arrays([out[f.name] if f.name in out else nulls(f.type, n) for f in schema.FRAMES],
                                    schema=schema.FRAMES)

    def summary(self) -> dict:
        """What the connections table says about it: frames, bytes and heartbeats by direction."""
        direction, msg = self.cols["direction"], self.cols.get("msg")
        content = msg >= 0 if msg is not None else np.zeros(self.n, bool)
        sizes = np.where(content, body_sizes(np.where(content, msg, 0)), 0)
        out = {"last_ts_ns": int(self.t0_ns + self.t[-1]), "heartbeats": self.methods.get("heartbeat", 0)}
        for d, name in ((TO_BROKER, "to_broker"), (TO_CLIENT, "to_client")):
            mine = direction == d
            rows, contents = int(mine.sum()), int((mine & content).sum())
            # Estimates: a header and a body frame per content; ~40 bytes a method frame.
            out[f"frames_{name}"] = rows + 2 * contents
            out[f"bytes_{name}"] = 40 * rows + 60 * contents + int(sizes[mine].sum())
        return out


_NULLS: dict = {}


def nulls(type_: pa.DataType, n: int) -> pa.Array:
    """An all-null column, sliced from one shared array per type (pa.nulls allocates its buffers)."""
    cached = _NULLS.get(type_)
    if cached is None or len(cached) < n:
        cached = _NULLS[type_] = pa.nulls(max(n, SLICE_ROWS), type_)
    return cached.slice(0, n)


def body_sizes(msg: np.ndarray) -> np.ndarray:
    """A message's body size, from its number: mostly 64 B - 2 KB, 2% of 64-264 KB."""
    h = mix64(msg ^ 0x5DEECE66D)
    return np.where((h >> np.uint64(20)) % np.uint64(100) < np.uint64(2),
                    65_536 + (h % np.uint64(200_000)).astype(np.int64), 64 + (h % np.uint64(1_900)).astype(np.int64))


def message_columns(msg: np.ndarray, corr: np.ndarray | None) -> dict[str, pa.Array]:
    """Content columns from the message number: a redelivered or republished message keeps them."""
    has = msg >= 0
    h1, h2, h3 = mix64(msg), mix64(msg ^ 0x5DEECE66D), mix64(msg + (1 << 40))
    with_id = has & (h1 % np.uint64(10) < np.uint64(8))   # 80% of publishers set message_id
    ids = pc.binary_join_element_wise("m-", pc.cast(pa.array(msg), pa.string()), "")
    body_hash = hex_strings([h2, h3])
    hashed = hex_strings([h1, h3], b"h:")
    null = pa.scalar(None, pa.string())
    message_id = pc.if_else(pa.array(with_id), ids, null)
    identity = pc.if_else(pa.array(with_id), pc.binary_join_element_wise("id:", ids, ""),
                          pc.if_else(pa.array(has), hashed, null))
    sizes = body_sizes(msg)
    columns = {"message_id": message_id, "message_identity": identity,
               "body_hash": pc.if_else(pa.array(has), body_hash, null),
               "body_size": pa.array(sizes, pa.int64(), mask=~has),
               "content_complete": pa.array(np.ones(len(msg), bool), mask=~has)}
    if corr is not None:
        columns["correlation_id"] = pc.if_else(pa.array(corr == 1), ids, null)
    return columns


# -- the plan: connections, channel numbers, incarnations ----------------------------------------

@dataclass
class Incarnation:
    kind: str
    body_frames: int
    end: str = "close"   # close, close_unacked (consumers: close with deliveries unacked), open (data ends first)


@dataclass
class ConnectionPlan:
    index: int
    start: int           # ns from the window start
    end: int
    stays_open: bool     # still open when the data ends
    slots: list          # per channel number: list of Incarnation
    hot: bool = False


def plan(params: Params) -> list[ConnectionPlan]:
    rng = np.random.default_rng([params.seed, 0])
    window = params.duration_s * S
    hot_groups = 1 / (0.3 + 0.7 * 6)   # acks per delivery on the hot channel (hot_channel: 30% single, else 2-10)
    hot_frames = int(params.hot_deliveries * (1 + hot_groups)) + 40
    rest = max(params.frames - hot_frames, 2_000)
    n_conn = params.connections or int(np.clip(rest // FRAMES_PER_CONNECTION, 5, 250))
    conns = [ConnectionPlan(0, int(0.002 * window), int(0.998 * window), False,
                            [[Incarnation("hot", params.hot_deliveries)]], hot=True)]
    kinds, weights = list(KINDS), np.array(list(KINDS.values()))
    specs = []
    for i in range(1, n_conn + 1):
        short = rng.random() < 0.2
        start = int(rng.uniform(0, 0.5 if short else 0.15) * window)
        length = int(rng.uniform(0.1, 0.4) * window) if short else int(rng.uniform(0.75, 0.98) * window)
        stays_open = rng.random() < 0.1
        end = int(0.998 * window) if stays_open else min(start + length, int(0.995 * window))
        slots = []
        for _ in range(int(rng.integers(2, 8))):
            lives = int(rng.choice([1, 2, 3], p=[0.6, 0.25, 0.15]))
            slot = []
            for k in range(lives):
                kind = kinds[rng.choice(len(kinds), p=weights / weights.sum())]
                last = k == lives - 1
                ending = "open" if (last and stays_open) else (
                    "close_unacked" if (not last and kind in CONSUMER_KINDS and kind != "consumer_auto"
                                        and rng.random() < 0.1 and not params.quiet) else "close")
                slot.append(Incarnation(kind, 0, ending))
                specs.append(slot[-1])
            slots.append(slot)
        conns.append(ConnectionPlan(i, start, end, stays_open, slots))
    # Share out what is left after the fixed rows (set-up, heartbeats, ends) by heavy-tailed weights.
    overhead = sum(14 + 2 * (c.end - c.start) // (HEARTBEAT_S // 2 * S) for c in conns[1:]) + 11 * len(specs)
    body = max(rest - overhead, len(specs))
    share = rng.lognormal(0.0, 1.0, len(specs))
    share = np.where([s.kind == "failed_declare" for s in specs], 0, share)
    frames = body * share / share.sum()
    # A poller's cap leaves frames over: they go to everyone else, pro rata.
    per_message = np.array([FRAMES_PER_MESSAGE[s.kind] for s in specs])
    capped = np.array([s.kind == "getter" for s in specs]) & (frames > MAX_GETS * per_message)
    spare = (frames[capped] - MAX_GETS * per_message[capped]).sum()
    frames[capped] = MAX_GETS * per_message[capped]
    frames[~capped] *= 1 + spare / max(frames[~capped].sum(), 1)
    for spec_, f, pm in zip(specs, frames, per_message):
        spec_.body_frames = int(max(f / pm, 3))
    return conns


# -- generation ----------------------------------------------------------------------------------

class Generator:
    def __init__(self, params: Params):
        self.params = params
        self.vocab = Vocab()
        self.t0_ns = int(datetime.fromisoformat(params.midnight).timestamp()) * S - params.duration_s * S * 2 // 3
        self.next_msg = 1
        self.stats = {"deliveries": Counter(), "publishes": Counter(), "kinds": Counter(), "methods": Counter(),
                      "redeliveries": 0, "returns": 0, "out_of_order_confirms": 0, "republishes": 0,
                      "incarnations": 0, "channel_numbers": 0, "connections": 0, "frames": 0,
                      "max_channel_deliveries": 0, "hot_connection_id": None, "hot_channel": 1,
                      "hot_deliveries": 0}

    def messages(self, n: int) -> np.ndarray:
        first, self.next_msg = self.next_msg, self.next_msg + n
        return np.arange(first, first + n, dtype=np.int64)

    # -- streams within a channel -----------------------------------------------------------------

    def deliveries(self, f: ConnectionFrames, rng, ch: int, start: int, span: int, n: int, *, no_ack: bool,
                   ctag: str, exchange: str, routing_key: str, end: str, carry: np.ndarray,
                   persistent: bool = True, single: float = 0.35, group: int = 8,
                   requeue_rate: float = 0.02, headers: np.ndarray | None = None, x_death=None) -> tuple[int, int, np.ndarray]:
        """basic.deliver frames and the client's acks; (last time, peak unacked, carried msgs)."""
        if n <= 0:
            return start, 0, np.zeros(0, np.int64)
        if self.params.quiet:
            requeue_rate = 0.0
        ends = group_ends(rng, n, single, group)   # a burst of deliveries, then the ack(s) for it
        t = bursts(rng, start, span, ends, 50 * US)
        msg = self.messages(n)
        redelivered = np.zeros(n, bool)
        c = min(len(carry), n)
        msg[:c], redelivered[:c] = carry[:c], True
        outcome = Counter()
        last = int(t[-1]) if n else start
        peak = 0
        carry_out = np.zeros(0, np.int64)
        if no_ack:
            outcome["auto"] += n
        else:
            sizes = np.diff(ends, prepend=-1)
            k = len(ends)
            settle = rising(t[ends] + 1 + rng.exponential(2 * MS, k).astype(np.int64))
            roll = rng.random(k)
            one = sizes == 1
            # 0 ack, 1 nack, 2 reject; requeue only on single nacks and rejects
            how = np.zeros(k, np.int8)
            requeue = np.full(k, -1, np.int8)
            r = requeue_rate
            for lo, hi, kind, rq in ((0, r * 0.6, 1, 1), (r * 0.6, r, 2, 1), (r, r * 1.3, 2, 0), (r * 1.3, r * 1.5, 1, 0)):
                pick = one & (roll >= lo) & (roll < hi)
                how[pick], requeue[pick] = kind, rq
            keep = np.ones(k, bool)
            if end != "close":
                keep[-1] = False  # the last group is still unacked when the channel closes or the data ends
            requeued = np.flatnonzero(keep & (requeue == 1))
            which, slots = later_slots(rng, t, settle[requeued], ends[requeued])
            msg[slots], redelivered[slots] = msg[ends[requeued[which]]], True
            kept = np.flatnonzero(keep)
            names = np.array([self.vocab("basic.ack"), self.vocab("basic.nack"), self.vocab("basic.reject")], np.int32)
            f.block(settle[kept], TO_BROKER, ch, names[how[kept]], delivery_tag=ends[kept] + 1,
                    multiple=np.where(how[kept] == 2, -1, sizes[kept] > 1),
                    requeue=np.where(how[kept] == 0, -1, requeue[kept]))
            for code, name in enumerate(("ack", "nack", "reject")):
                outcome[name] += int(sizes[kept][how[kept] == code].sum())
            if not keep[-1]:
                lost = int(sizes[-1])
                outcome["open" if end == "open" else "channel_closed"] += lost
                if end == "close_unacked":
                    carry_out = msg[n - lost:]
            if len(kept):
                last = max(last, int(settle[kept][-1]))
            # Unacked at each delivery: its tag less the tags settled before it.
            done = np.searchsorted(settle[kept], t, side="left")
            settled_tags = (np.where(done > 0, ends[kept][np.maximum(done - 1, 0)] + 1, 0) if len(kept)
                            else np.zeros(n, np.int64))
            peak = int((np.arange(1, n + 1) - settled_tags).max())
        content = dict(redelivered=redelivered, exchange=exchange, routing_key=routing_key, msg=msg,
                       delivery_mode=2 if persistent else 1, content_type="application/json",
                       headers=headers, x_death_count=x_death)
        f.block(t, TO_CLIENT, ch, "basic.deliver", delivery_tag=np.arange(1, n + 1), consumer_tag=ctag, **content)
        self.stats["deliveries"].update(outcome)
        self.stats["redeliveries"] += int(redelivered.sum())
        self.stats["max_channel_deliveries"] = max(self.stats["max_channel_deliveries"], n)
        return last, peak, carry_out

    def publishes(self, f: ConnectionFrames, rng, ch: int, start: int, span: int, n: int, *, confirm: bool,
                  persistent: bool, mandatory: bool, exchange: str, routing_key: str, end: str,
                  reply_to: str | None = None) -> int:
        """basic.publish frames and, in confirm mode, the broker's confirms; the last time."""
        if n <= 0:
            return start
        ends = group_ends(rng, n, 0.15, 40)   # a burst of publishes, confirmed together
        t = bursts(rng, start, span, ends, 100 * US)
        msg = self.messages(n)
        last = int(t[-1]) if n else start
        outcome = Counter()
        if not confirm:
            outcome["untracked"] += n
        else:
            sizes = np.diff(ends, prepend=-1)
            k = len(ends)
            latency = rng.exponential(25 * MS if persistent else 2 * MS, k).astype(np.int64)
            at = rising(t[ends] + 2 + latency, step=2)          # room for a split confirm at at+1
            nack = rng.random(k) < 0.004
            split = (sizes >= 2) & (rng.random(k) < 0.02)         # the batch's last publish confirmed first
            keep = np.ones(k, bool)
            if end == "open":
                keep[-1] = False
            methods = np.where(nack, self.vocab("basic.nack"), self.vocab("basic.ack")).astype(np.int32)
            requeue = np.where(nack, 0, -1)
            main = keep
            f.block(at[main], TO_CLIENT, ch, methods[main], delivery_tag=ends[main] + 1,
                    multiple=(sizes[main] > 1) & ~split[main], requeue=requeue[main])
            rest = keep & split
            f.block(at[rest] + 1, TO_CLIENT, ch, methods[rest], delivery_tag=ends[rest],
                    multiple=sizes[rest] > 2, requeue=requeue[rest])
            self.stats["out_of_order_confirms"] += int(rest.sum())
            outcome["acked"] += int(sizes[keep & ~nack].sum())
            outcome["nacked"] += int(sizes[keep & nack].sum())
            if not keep[-1]:
                outcome["open"] += int(sizes[-1])
            if keep.any():
                last = max(last, int(at[keep][-1] + 1))
            # A nacked message is published again a little later (same identity).
            first = ends - sizes + 1
            nacked = np.concatenate([np.arange(a, b + 1) for a, b in zip(first[keep & nack], ends[keep & nack])]
                                    ) if (keep & nack).any() else np.zeros(0, np.int64)
            batch_of = np.searchsorted(ends, nacked)
            forbidden = np.concatenate([np.arange(a, b + 1) for a, b in zip(first[nack], ends[nack])]
                                       ) if nack.any() else np.zeros(0, np.int64)
            which, slots = later_slots(rng, t, at[batch_of], forbidden)
            msg[slots] = msg[nacked[which]]
            self.stats["republishes"] += len(slots)
            if mandatory:  # an unroutable one comes back before its confirm
                returned = np.flatnonzero(rng.random(n) < 0.01)
                returned = returned[keep[np.searchsorted(ends, returned)]]
                confirm_at = at[np.searchsorted(ends, returned)]
                t_ret = t[returned] + 1 + (confirm_at - t[returned] - 1) // 2
                f.block(t_ret, TO_CLIENT, ch, "basic.return", reply_code=312, reply_text="NO_ROUTE",
                        exchange=exchange, routing_key=routing_key, msg=msg[returned],
                        delivery_mode=2 if persistent else 1, content_type="application/json")
                self.stats["returns"] += len(returned)
        f.block(t, TO_BROKER, ch, "basic.publish", exchange=exchange, routing_key=routing_key,
                mandatory=mandatory, immediate=False, msg=msg, delivery_mode=2 if persistent else 1,
                content_type="application/json", reply_to=reply_to, corr=reply_to is not None,
                app_id=exchange.split(".")[0] if exchange else None)
        self.stats["publishes"].update(outcome)
        return last

    # -- one incarnation --------------------------------------------------------------------------

    def incarnation(self, f: ConnectionFrames, rng, ch: int, life: Incarnation, start: int, span: int,
                    app: str, carry: np.ndarray) -> tuple[int, np.ndarray]:
        kind, n, end = life.kind, life.body_frames, life.end
        rtt = lambda: int(rng.uniform(0.15, 1.5) * MS)  # noqa: E731
        t = start
        f.control(t, TO_BROKER, ch, amqp.Channel.Open())
        t += rtt()
        f.control(t, TO_CLIENT, ch, amqp.Channel.OpenOk())
        queue = f"{app}.{rng.choice(['work', 'events', 'audit', 'retry'])}.{int(rng.integers(0, 40))}"
        exchange = f"{app}.{rng.choice(['events', 'commands', 'topic'])}"
        routing_key = f"{app}.{rng.choice(['created', 'updated', 'deleted', 'synced'])}"
        persistent = rng.random() < 0.6
        consumer = kind in CONSUMER_KINDS or kind == "rpc"
        publisher = kind.startswith("publisher") or kind in ("rpc", "pubsub")
        confirm = kind in ("publisher_confirm", "pubsub")
        qos = None
        ctag = None
        if kind == "failed_declare":
            t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Queue.Declare(queue=queue + ".missing", passive=True))
            t += rtt()
            f.control(t, TO_CLIENT, ch, amqp.Channel.Close(
                reply_code=404, reply_text=f"NOT_FOUND - no queue '{queue}.missing' in vhost '/'",
                class_id=50, method_id=10))
            t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Channel.CloseOk())
            self.stats["kinds"][kind] += 1
            return t, np.zeros(0, np.int64)
        if publisher and kind != "rpc":
            t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Exchange.Declare(exchange=exchange, exchange_type="topic", durable=True))
            t += rtt()
            f.control(t, TO_CLIENT, ch, amqp.Exchange.DeclareOk())
        if confirm:
            t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Confirm.Select())
            t += rtt()
            f.control(t, TO_CLIENT, ch, amqp.Confirm.SelectOk())
        if consumer:
            no_ack = kind in ("consumer_auto", "rpc")
            if kind == "rpc":
                queue = "amq.rabbitmq.reply-to"
            else:
                if kind == "consumer_dlq":
                    queue = f"{app}.dlq"
                t += rtt()
                f.control(t, TO_BROKER, ch, amqp.Queue.Declare(queue=queue, durable=True,
                                                                arguments={"x-queue-type": "quorum"}))
                t += rtt()
                f.control(t, TO_CLIENT, ch, amqp.Queue.DeclareOk(queue=queue, message_count=int(rng.integers(0, 5000)),
                                                                   consumer_count=int(rng.integers(0, 4))))
            if not no_ack and kind != "consumer_unbounded":
                t += rtt()
                qos = f.control(t, TO_BROKER, ch, amqp.Basic.Qos(prefetch_count=0))
                t += rtt()
                f.control(t, TO_CLIENT, ch, amqp.Basic.QosOk())
            ctag = f"amq.ctag-{int(mix64(np.array([self.next_msg + ch]))[0]) % (1 << 60):015x}"
            t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Basic.Consume(queue=queue, no_ack=no_ack))
            t += rtt()
            f.control(t, TO_CLIENT, ch, amqp.Basic.ConsumeOk(consumer_tag=ctag))
        elif kind == "getter":
            t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Queue.Declare(queue=queue, durable=True))
            t += rtt()
            f.control(t, TO_CLIENT, ch, amqp.Queue.DeclareOk(queue=queue, message_count=0, consumer_count=0))

        body_start = t + rtt()
        body_span = max(start + span - body_start, MS)
        last, peak, carry_out = body_start, 0, np.zeros(0, np.int64)
        if kind == "rpc":
            m = max(n // 2, 1)
            last = self.publishes(f, rng, ch, body_start, body_span, m, confirm=False, persistent=False,
                                  mandatory=False, exchange="", routing_key=f"{app}.rpc", end=end,
                                  reply_to="amq.rabbitmq.reply-to")
            last2, _, _ = self.deliveries(f, rng, ch, body_start + 3 * MS, body_span, m, no_ack=True, ctag=ctag,
                                          exchange="", routing_key="amq.rabbitmq.reply-to", end=end,
                                          carry=np.zeros(0, np.int64), persistent=False)
            last = max(last, last2)
        elif kind == "getter":
            last = self.gets(f, rng, ch, body_start, body_span, n, queue, end)
        else:
            if publisher:
                last = self.publishes(f, rng, ch, body_start, body_span, n if kind != "pubsub" else n // 2,
                                      confirm=confirm, persistent=persistent, mandatory=rng.random() < 0.15,
                                      exchange=exchange, routing_key=routing_key, end=end)
            if consumer:
                dlq = kind == "consumer_dlq"
                x_death = headers = None
                # Dead-lettered 1-3 times: the x-death header (as the decoder writes it) and its count.
                if dlq and not self.params.quiet:
                    x_death = rng.integers(1, 4, n)
                    variants = np.array([self.vocab(json.dumps(
                        {"x-death": [{"count": c, "exchange": "", "queue": f"{app}.work", "reason": "rejected"}]},
                        sort_keys=True, separators=(",", ":"))) for c in (1, 2, 3)], np.int32)
                    headers = variants[x_death - 1]
                last2, peak, carry_out = self.deliveries(
                    f, rng, ch, body_start, body_span, n if kind != "pubsub" else n // 2,
                    no_ack=kind == "consumer_auto", ctag=ctag, exchange=exchange, routing_key=routing_key, end=end,
                    carry=carry, persistent=persistent, requeue_rate=0.0 if dlq else 0.02,
                    single=0.9 if dlq else 0.35, headers=headers, x_death=x_death)
                last = max(last, last2)
        if qos is not None:  # prefetch: the usual 100-300, never below what the deliveries needed
            qos["prefetch_count"] = int(max(rng.choice([100, 200, 250, 300]), -(-peak // 50) * 50))
        t = last + rtt()
        if end != "open":
            if consumer and end == "close":
                f.control(t, TO_BROKER, ch, amqp.Basic.Cancel(consumer_tag=ctag))
                t += rtt()
                f.control(t, TO_CLIENT, ch, amqp.Basic.CancelOk(consumer_tag=ctag))
                t += rtt()
            f.control(t, TO_BROKER, ch, amqp.Channel.Close(reply_code=200, reply_text="Normal shutdown"))
            t += rtt()
            f.control(t, TO_CLIENT, ch, amqp.Channel.CloseOk())
        self.stats["kinds"][kind] += 1
        return t, carry_out

    def gets(self, f: ConnectionFrames, rng, ch: int, start: int, span: int, n: int, queue: str, end: str) -> int:
        """basic.get polling: get, then get-ok (acked alone) or get-empty."""
        cycle = 6 * MS   # get, reply after 1 ms, ack 1 ms later: the next get comes after that
        n = int(max(1, min(n, span // cycle - 1)))
        spread = np.cumsum(rng.exponential(1.0, n))
        t = start + (spread * ((span - (n + 1) * cycle) / spread[-1])).astype(np.int64) + cycle * np.arange(1, n + 1)
        got = rng.random(n) < 0.8
        f.block(t, TO_BROKER, ch, "basic.get", queue=queue, no_ack=False)
        f.block(t[~got] + 1 * MS, TO_CLIENT, ch, "basic.get-empty")
        hits = t[got] + 1 * MS
        k = len(hits)
        msg = self.messages(k)
        f.block(hits, TO_CLIENT, ch, "basic.get-ok", delivery_tag=np.arange(1, k + 1), redelivered=False,
                exchange="", routing_key=queue, message_count=rng.integers(0, 20, k), msg=msg, delivery_mode=2,
                content_type="application/json")
        acked = k - 1 if (end != "close" and k) else k
        f.block(hits[:acked] + 2 * MS, TO_BROKER, ch, "basic.ack", delivery_tag=np.arange(1, acked + 1), multiple=False)
        self.stats["deliveries"].update({"ack": acked})
        if acked < k:
            self.stats["deliveries"]["open" if end == "open" else "channel_closed"] += 1
        return int(t[-1] + 3 * MS) if n else start

    # -- one connection ---------------------------------------------------------------------------

    def connection(self, c: ConnectionPlan, packet_base: int) -> tuple[pa.Table, dict]:
        rng = np.random.default_rng([self.params.seed, 1, c.index])
        f = ConnectionFrames(self.vocab)
        client = CLIENTS[int(rng.integers(0, len(CLIENTS)))] if not c.hot else CLIENTS[1]
        app = APPS[c.index % len(APPS)] if not c.hot else "orders"
        broker_addr, cluster = BROKERS[c.index % len(BROKERS)]
        client_addr = f"10.{1 + c.index // 250 % 200}.{c.index // 250 // 200 % 250}.{10 + c.index % 240}"
        client_port = 32768 + int(rng.integers(0, 28000))
        first_ns = self.t0_ns + c.start - int(rng.uniform(0.2, 1.0) * MS)   # the SYN
        connection_id = f"{client_addr}:{client_port}>{broker_addr}:5672@{first_ns}"
        rtt = lambda: int(rng.uniform(0.15, 1.5) * MS)  # noqa: E731
        t = c.start
        f.control(t, TO_BROKER, 0, detail=spec.PROTOCOL_HEADER_091.hex(), method="amqp.protocol-header")
        for direction, command in ((TO_CLIENT, amqp.Connection.Start()),
                                   (TO_BROKER, amqp.Connection.StartOk(mechanism="PLAIN", response="")),
                                   (TO_CLIENT, amqp.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=HEARTBEAT_S)),
                                   (TO_BROKER, amqp.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=HEARTBEAT_S)),
                                   (TO_BROKER, amqp.Connection.Open(virtual_host="/")),
                                   (TO_CLIENT, amqp.Connection.OpenOk())):
            t += rtt()
            f.control(t, direction, 0, command)
        opened = t + rtt()
        ends = [opened]
        for number, slot in enumerate(c.slots, start=1):
            self.stats["channel_numbers"] += 1
            begin = opened + int(rng.uniform(0, 0.02) * (c.end - opened)) if not c.hot else opened
            span = (c.end - begin) // len(slot)
            carry = np.zeros(0, np.int64)
            for k, life in enumerate(slot):
                self.stats["incarnations"] += 1
                life_start = max(begin + k * span, ends[-1] if k else begin)
                if c.hot:
                    done = self.hot_channel(f, rng, number, life, life_start, span)
                    carry = np.zeros(0, np.int64)
                else:
                    # An incarnation still open when the data ends is busy to the end.
                    share = 0.999 if life.end == "open" else rng.uniform(0.8, 0.97)
                    done, carry = self.incarnation(f, rng, number, life, life_start, int(span * share), app, carry)
                    if k + 1 < len(slot) and slot[k + 1].kind not in CONSUMER_KINDS:
                        carry = np.zeros(0, np.int64)  # requeued, and taken by some other consumer
                ends.append(done + rtt())
        last = max(ends)
        if rng.random() < 0.05 and not c.hot:
            when = c.start + (c.end - c.start) // 2
            f.control(when, TO_CLIENT, 0, amqp.Connection.Blocked(reason="low on memory"))
            f.control(when + 4 * S, TO_CLIENT, 0, amqp.Connection.Unblocked())
        closing = not c.stays_open
        if closing:
            t = last + rtt()
            f.control(t, TO_BROKER, 0, amqp.Connection.Close(reply_code=200, reply_text="Normal shutdown"))
            t += rtt()
            f.control(t, TO_CLIENT, 0, amqp.Connection.CloseOk())
            t += rtt()
            f.control(t, TO_BROKER, 0, method="tcp.fin")
            f.control(t + 100 * US, TO_CLIENT, 0, method="tcp.fin")
            stop = t
        else:
            stop = self.params.duration_s * S
        beats = np.arange(c.start + HEARTBEAT_S // 2 * S, stop, HEARTBEAT_S // 2 * S, dtype=np.int64)
        f.block(beats + rng.integers(0, 5 * MS, len(beats)), TO_BROKER, 0, "heartbeat")
        f.block(beats + rng.integers(5 * MS, 10 * MS, len(beats)), TO_CLIENT, 0, "heartbeat")
        if not closing and len(beats):   # the data ends after this connection's last row
            stop = int(beats[-1]) + 10 * MS
        agent = f"agent-{cluster.split('@')[1]}"
        done = f.finish(self.t0_ns, {"connection_id": connection_id, "agent_id": agent,
                                     "client_addr": client_addr, "client_port": client_port,
                                     "server_addr": broker_addr, "server_port": 5672,
                                     "source": f"capture-{cluster.split('@')[1]}-{self.params.seed}.pcapng"},
                        packet_base)
        row = self.connection_row(done.summary(), c, client, app, cluster, client_addr, client_port, broker_addr,
                                  connection_id, agent, done.constants["source"], first_ns, closing)
        self.stats["connections"] += 1
        self.stats["frames"] += done.n
        self.stats["methods"].update(done.methods)
        if c.hot:
            self.stats["hot_connection_id"] = connection_id
        return done, row

    def hot_channel(self, f: ConnectionFrames, rng, ch: int, life: Incarnation, start: int, span: int) -> int:
        """The skewed one: a single consumer with millions of deliveries, acked singly and in batches."""
        t = start
        f.control(t, TO_BROKER, ch, amqp.Channel.Open())
        f.control(t + MS, TO_CLIENT, ch, amqp.Channel.OpenOk())
        qos = f.control(t + 2 * MS, TO_BROKER, ch, amqp.Basic.Qos(prefetch_count=0))
        f.control(t + 3 * MS, TO_CLIENT, ch, amqp.Basic.QosOk())
        ctag = "amq.ctag-hot-orders-consumer"
        f.control(t + 4 * MS, TO_BROKER, ch, amqp.Basic.Consume(queue="orders.work.hot"))
        f.control(t + 5 * MS, TO_CLIENT, ch, amqp.Basic.ConsumeOk(consumer_tag=ctag))
        last, peak, _ = self.deliveries(f, rng, ch, t + 6 * MS, span - 20 * MS, life.body_frames, no_ack=False,
                                        ctag=ctag, exchange="orders.events", routing_key="orders.created",
                                        end="close", carry=np.zeros(0, np.int64), single=0.3, group=10,
                                        requeue_rate=0.002)
        qos["prefetch_count"] = int(max(1000, -(-peak // 100) * 100))
        t = last + MS
        f.control(t, TO_BROKER, ch, amqp.Basic.Cancel(consumer_tag=ctag))
        f.control(t + MS, TO_CLIENT, ch, amqp.Basic.CancelOk(consumer_tag=ctag))
        f.control(t + 2 * MS, TO_BROKER, ch, amqp.Channel.Close(reply_code=200, reply_text="Normal shutdown"))
        f.control(t + 3 * MS, TO_CLIENT, ch, amqp.Channel.CloseOk())
        self.stats["kinds"]["hot"] += 1
        self.stats["hot_deliveries"] = life.body_frames
        return t + 3 * MS

    def connection_row(self, summary: dict, c: ConnectionPlan, client, app, cluster, client_addr, client_port,
                       broker_addr, connection_id, agent, source, first_ns, closing) -> dict:
        product, version, platform = client
        return {
            "first_ts_ns": first_ns, "connection_id": connection_id, "agent_id": agent, "source": source,
            "client_addr": client_addr, "client_port": client_port,
            "server_addr": broker_addr, "server_port": 5672, "ip_version": 4, "protocol": "amqp-0-9-1",
            "started_at_syn": True, "client_product": product, "client_version": version, "client_platform": platform,
            "connection_name": f"{app}-{c.index}", "client_capabilities":
                '{"authentication_failure_close":true,"basic.nack":true,"connection.blocked":true,'
                '"consumer_cancel_notify":true,"publisher_confirms":true}',
            "server_product": "RabbitMQ", "server_version": "3.13.7", "server_platform": "Erlang/OTP 26.2.5",
            "cluster_name": cluster, "auth_mechanisms_offered": "PLAIN AMQPLAIN", "auth_mechanism": "PLAIN",
            "user": app, "vhost": "/", "offered_channel_max": 2047, "offered_frame_max": 131072,
            "offered_heartbeat": HEARTBEAT_S, "channel_max": 2047, "frame_max": 131072, "heartbeat": HEARTBEAT_S,
            "close_code": 200 if closing else None, "close_text": "Normal shutdown" if closing else None,
            "closed_by": "client" if closing else None, "ended_by": "connection.close" if closing else "end-of-capture",
            "gaps": 0, "gap_bytes": 0, "retransmitted_bytes": 0, "framing_errors": 0, **summary,
        }


def generate(params: Params):
    """Yield (Finished, connection row) per connection (consume its `tables()` before the next);
    the last item is the generator's stats."""
    gen = Generator(params)
    packets = 0
    for c in plan(params):
        done, row = gen.connection(c, packets)
        packets = int(done.packet[-1]) + 1
        yield done, row
    yield _plain(gen.stats)


def frames_table(params: Params) -> tuple[pa.Table, dict]:
    """Everything in memory (small scales: tests): the frames table and the stats."""
    tables = []
    for item in generate(params):
        if isinstance(item, dict):
            return pa.concat_tables(tables), item
        tables.extend(item[0].tables())
    raise AssertionError("unreachable")


def lake_tables(params: Params) -> tuple[pa.Table, pa.Table]:
    """Everything in memory (small scales: tests): the frames and connections tables."""
    frames, connection_rows = [], []
    for item in generate(params):
        if not isinstance(item, dict):
            frames.extend(item[0].tables())
            connection_rows.append(item[1])
    return pa.concat_tables(frames), connections_table(connection_rows)


def as_appended(frames: pa.Table, quantiles: list[float]) -> list[pa.Table]:
    """`frames` cut by time at these quantiles of `ts_ns` into the pieces an agent would append, in
    order: each connection's rows stay in seq order across pieces (a later piece never holds an
    earlier seq of the same connection)."""
    frames = frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")])
    ts = frames["ts_ns"].to_numpy()
    piece = np.searchsorted(np.quantile(ts, quantiles), ts, side="right")
    ids = frames["connection_id"].to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    for lo, hi in zip(starts, np.r_[starts[1:], len(ids)]):
        piece[lo:hi] = np.maximum.accumulate(piece[lo:hi])
    return [frames.filter(pa.array(piece == i)) for i in range(len(quantiles) + 1)]

def _plain(stats: dict) -> dict:
    return {k: dict(sorted(v.items())) if isinstance(v, Counter) else v for k, v in stats.items()}


def write_lake(lake_dir: str, params: Params) -> dict:
    """Generate into `lake_dir` (frames and connections), in `params.commits` commits per table.
    Connections are written as they are made: memory stays bounded by the largest one."""
    started = time.perf_counter()
    n_conn = len(plan(params))
    per_commit = -(-n_conn // max(params.commits, 1))
    frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    connections = lake.TableWriter(lake_dir, "connections", schema.CONNECTIONS)
    pending, connection_rows, commit_no = [], [], 0

    def flush():
        if pending:
            frames.write(pa.concat_tables(pending))
            pending.clear()

    def commit():
        nonlocal frames, connections, connection_rows, commit_no
        flush()
        app_id = f"ackscope-bench-generator-{params.key()}-{commit_no}"
        frames.commit(app_id, {"generator": "bench/frames_generator.py", "params": json.dumps(asdict(params))})
        connections.write(connections_table(connection_rows))
        connections.commit(app_id)
        frames = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
        connections = lake.TableWriter(lake_dir, "connections", schema.CONNECTIONS)
        connection_rows, commit_no = [], commit_no + 1

    for number, item in enumerate(generate(params), start=1):
        if isinstance(item, dict):
            stats = item
            break
        done, row = item
        for table in done.tables():
            pending.append(table)
            if sum(t.num_rows for t in pending) >= WRITE_ROWS:
                flush()
        connection_rows.append(row)
        if number % per_commit == 0 or number == n_conn:
            commit()
    stats["seconds"] = round(time.perf_counter() - started, 1)
    stats["bytes_on_disk"] = {name: dir_size(os.path.join(lake_dir, name)) for name in ("frames", "connections")}
    stats["params"] = asdict(params)
    stats["generator_version"] = GENERATOR_VERSION
    return stats


def verify(params: Params, log=None) -> dict:
    """Stream the generated frames through the reference model (analyzer.timeline), connection by
    connection and in batches, so that scale fits in memory: no violation, and deliveries' and
    publishes' outcomes as counted by the generator. Slow (pure Python, ~1 s per 20,000 frames)."""
    from analyzer.timeline import ChannelFacts, Delivery, Publish, Timelines, Violation

    got = {"deliveries": Counter(), "publishes": Counter(), "violations": Counter(), "incarnations": 0}

    def tally(records):
        for x in records:
            if type(x) is Delivery:
                got["deliveries"][x.outcome] += 1
            elif type(x) is Publish:
                got["publishes"][x.outcome] += 1
            elif type(x) is ChannelFacts:
                got["incarnations"] += 1
            elif type(x) is Violation:
                got["violations"][x.kind] += 1

    for number, item in enumerate(generate(params), start=1):
        if isinstance(item, dict):
            stats = item
            break
        done, _row = item
        timelines = Timelines()
        for table in done.tables():
            for batch in table.to_batches(max_chunksize=50_000):
                for row in batch.to_pylist():
                    tally(timelines.feed(row))
        tally(timelines.end_of_data())
        if log is not None:
            log(f"  verified connection {number}: {done.n:,} frames")
    problems = []
    if got["violations"]:
        problems.append(f"violations: {dict(got['violations'])}")
    for name in ("deliveries", "publishes"):
        if dict(got[name]) != {k: v for k, v in stats[name].items() if v}:
            problems.append(f"{name}: model {dict(sorted(got[name].items()))}, generator {stats[name]}")
    if got["incarnations"] != stats["incarnations"]:
        problems.append(f"incarnations: model {got['incarnations']}, generator {stats['incarnations']}")
    return {"problems": problems, "deliveries": dict(got["deliveries"]), "publishes": dict(got["publishes"]),
            "incarnations": got["incarnations"], "frames": stats["frames"]}


def dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name)) for root, _dirs, files in os.walk(path) for name in files)


def cached_lake(out_dir: str, params: Params, regenerate: bool = False, log=print) -> tuple[str, dict]:
    """The lake for `params` under out_dir, generated on first use. Its stats (`generated.json`)
    are written last, so a lake without them was cut short and is made again."""
    home = os.path.join(out_dir, "analyze", params.key())
    lake_dir, stats_path = os.path.join(home, "lake"), os.path.join(home, "generated.json")
    if not regenerate and os.path.exists(stats_path):
        with open(stats_path) as f:
            return lake_dir, json.load(f)
    shutil.rmtree(home, ignore_errors=True)
    os.makedirs(home)
    log(f"generating {params.frames:,} frames ({params.hot_deliveries:,} on the hot channel, seed {params.seed}) "
        f"into {lake_dir} ...")
    stats = write_lake(lake_dir, params)
    with open(stats_path + ".tmp", "w") as f:
        json.dump(stats, f, indent=1)
    os.replace(stats_path + ".tmp", stats_path)
    return lake_dir, stats


def params_from_args(args) -> Params:
    return Params(frames=args.frames, hot_deliveries=args.hot_deliveries, seed=args.seed,
                  connections=args.connections, duration_s=args.duration, quiet=args.quiet)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=int, default=10_000_000, metavar="N",
                        help="frames (rows) to generate, about (default %(default)s)")
    parser.add_argument("--hot-deliveries", type=int, default=3_000_000, metavar="N",
                        help="deliveries on the one hot channel (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--connections", type=int, default=None, metavar="N",
                        help="connections besides the hot one (default: frames / 24,000, 5 to 250)")
    parser.add_argument("--duration", type=int, default=3600, metavar="S",
                        help="capture window in seconds; midnight UTC falls 2/3 of the way in (default %(default)s)")
    parser.add_argument("--quiet", action="store_true",
                        help="no nack or reject, no dead-lettered message and no channel closed with deliveries "
                             "unacked: nothing the message kinds (requeue_loop, redelivery_after_close) read")


def add_spark_run_arguments(parser: argparse.ArgumentParser, frames: int, hot_deliveries: int) -> None:
    """`add_arguments` with these defaults, and what a bench that runs Spark on the lake takes:
    --master, --driver-memory and --out (where generated lakes are cached)."""
    add_arguments(parser)
    parser.set_defaults(frames=frames, hot_deliveries=hot_deliveries)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"),
                        help="where generated lakes are cached (default %(default)s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lake", metavar="DIR", help="lake folder to create (must not hold frames yet)")
    parser.add_argument("--verify", action="store_true",
                        help="instead of writing, run the frames through the reference model (slow: ~10 min for 10 M)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.verify:
        result = verify(params_from_args(args), log=lambda line: print(line, flush=True))
        print(json.dumps(result, indent=1))
        return 1 if result["problems"] else 0
    if not args.lake:
        parser.error("--lake DIR is required (or --verify)")
    if os.path.exists(os.path.join(args.lake, "frames")):
        parser.error(f"{args.lake} already has a frames table")
    stats = write_lake(args.lake, params_from_args(args))
    print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
