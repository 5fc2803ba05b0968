"""One connection's timeline carried from one analysis run to the next.

A scheduled run should cost the frames that arrived since the last run, not the connection's
history. The state machine here is sans-IO and emits each record once, when it becomes final
(connection.Timelines), so its state after a run's last frame is everything the next run needs:
the next run resumes it and feeds it only the new frames. What the state holds is bounded by what
is open (outstanding deliveries, unconfirmed publishes, consumers, modes, prefetch), not by history.

A `Checkpoint` is that state plus what the stored tables need to be patched instead of rewritten:
- `provisional`: the records the last run wrote for what was still open (its end() on a copy of
  the state). The next run deletes exactly those rows and writes their new versions.
- `boundary`: the Delivery and Publish records channel_metrics needs for buckets from
  `boundary_ns` (the bucket of the connection's last frame) on: what arrived or was settled from
  then on, what is still outstanding (never settled, and counted as unacked or unconfirmed), and
  the latest basic.deliver before it (its prefetch is the one in force). The next run recomputes
  those buckets, and only those, from them and its own records.

The checkpoint is exact only if the new frames continue the old ones and nothing they change lands
in a bucket before the boundary; `ResumedConnection` checks both and otherwise says why
(`fallback`): the caller then analyses the connection whole, as a first run would.

A checkpoint is stored as data (state.py: JSON of plain values, read back into fresh state objects
only, versioned): a checkpoint of another version, damaged or forged, is refused with the reason
and its connection analysed whole. Beside the timeline it carries the detectors' state
(analyzer/detectors/state.py, its own document: the timeline does not read it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .. import folds
from . import records as r
from . import state
from .connection import ConnectionTimeline
from .metrics import ever_outstanding
from .state import FORMAT, StateError  # noqa: F401 - the checkpoint format and its error, for callers

# Rows between two prunings of the records kept for the next checkpoint's boundary.
PRUNE_EVERY_ROWS = 1 << 16


@dataclass
class Checkpoint:
    timeline: ConnectionTimeline           # after the last frame analysed; its emit hook detached
    provisional: tuple = ()                 # records the last run wrote for what was open
    boundary: tuple = ()                    # Delivery/Publish records channel_metrics needs from boundary_ns on
    boundary_ns: int = 0
    # The detectors' state after the final records (analyzer/detectors/state.py's document; None:
    # not kept). Carried here untouched: the timeline does not read it.
    detectors: dict | None = None

    @property
    def last_seq(self) -> int | None:
        return self.timeline.last_seq

    @property
    def last_ts_ns(self) -> int | None:
        return self.timeline.last_ts_ns


@dataclass
class Continued:
    """What one run of one connection gives (empty lists and `fallback` set when it cannot carry)."""
    rows: list = field(default_factory=list)        # records to write (final ones and the new provisional ones)
    stale: list = field(default_factory=list)       # the last run's provisional records: rows to delete first
    touched: set = field(default_factory=set)       # (channel, incarnation) whose metrics from boundary_ns are replaced
    boundary_ns: int | None = None                  # None: a connection new to this run (nothing stored to patch)
    checkpoint: Checkpoint | None = None            # None: the fallback, or the connection ended
    fallback: str | None = None
    timeline: ConnectionTimeline | None = None      # the state after the new frames (the checkpoint's, if kept)


def bucket_start(ts_ns: int, bucket_ns: int) -> int:
    return ts_ns - ts_ns % bucket_ns


def continue_connection(checkpoint: Checkpoint | None, rows: Iterable[Mapping], bucket_ns: int,
                        overdue_ns: int = r.DEFAULT_OVERDUE_NS, keep_rows: bool = True) -> Continued:
    """Feed `rows` (one connection, seq order) to the timeline `checkpoint` left (None: the
    connection's first rows), collecting what ResumedConnection streams. `keep_rows=False` builds a
    checkpoint only (a whole-connection run wrote the tables another way)."""
    written: list = []
    resumed = None
    for row in rows:
        if resumed is None:
            resumed = ResumedConnection(checkpoint, row["connection_id"], row.get("agent_id"),
                                        written.append if keep_rows else _drop, bucket_ns, overdue_ns)
        resumed.feed(row)
        if resumed.fallback is not None:
            return Continued(fallback=resumed.fallback)
    if resumed is None:
        if checkpoint is None:
            return Continued(fallback="no frames")
        resumed = ResumedConnection(checkpoint, checkpoint.timeline.id, checkpoint.timeline.agent_id,
                                    written.append if keep_rows else _drop, bucket_ns, overdue_ns)
    kept = resumed.finish()
    if resumed.fallback is not None:
        return Continued(fallback=resumed.fallback)
    if kept is None and resumed.no_checkpoint != "ended":
        return Continued(fallback=resumed.no_checkpoint)
    return Continued(rows=written, stale=resumed.stale, touched=resumed.touched, boundary_ns=resumed.boundary_ns,
                     timeline=resumed.timeline, checkpoint=kept)


def _drop(record) -> None:
    pass


class WholeConnection:
    """A connection analysed from its first frame, streamed: every record goes to `out` as it becomes
    final (and the open ones at the end), exactly what `replay` gives, while only what the next
    run's checkpoint needs is kept (the boundary records, pruned as the frames go by). What the
    Spark pass runs for each connection it analyses whole.

    `finish()` ends the data and returns the checkpoint the next run carries on from, or None with
    `no_checkpoint` saying why: the connection ended (closed, FIN/RST: new frames of it are analysed
    whole again), or its frame times went back past records already dropped."""

    # Slotted: connection_analysis.py's C hand-off appends to `kept` per record.
    __slots__ = ("out", "bucket_ns", "kept", "timeline", "rows", "pruned_to", "no_checkpoint")
    # ResumedConnection's: why it cannot carry on, and its carried bucket (no new frame may be older).
    fallback: str | None = None
    boundary_ns: int | None = None

    def __init__(self, connection_id: str, agent_id: str | None, out, bucket_ns: int,
                 overdue_ns: int = r.DEFAULT_OVERDUE_NS):
        self.out, self.bucket_ns = out, bucket_ns
        self.kept: list = []
        self.timeline = ConnectionTimeline(connection_id, agent_id, self._emit, overdue_ns)
        self.rows = 0
        self.pruned_to: int | None = None
        self.no_checkpoint: str | None = None

    def _emit(self, record) -> None:
        self.out(record)
        self.kept.append(record)

    def feed(self, row: Mapping) -> None:
        self.timeline.feed(row)
        self.rows += 1
        if self.rows % PRUNE_EVERY_ROWS == 0:
            self._prune()

    def feed_plain(self, rows: list, start: int, stop: int) -> int:
        """`feed` on rows[start:stop] in turn while each is a plain frame of this connection
        (ConnectionTimeline.feed_plain) and not older than `boundary_ns` (a resumed connection's:
        `feed` takes an older one, and falls back), stopping at the next prune: the index of the
        first row not fed."""
        stop = min(stop, start + PRUNE_EVERY_ROWS - self.rows % PRUNE_EVERY_ROWS)
        done = self.timeline.feed_plain(rows, start, stop, self.boundary_ns)
        if done > start:
            self.rows += done - start
            if self.rows % PRUNE_EVERY_ROWS == 0:
                self._prune()
        return done

    def _prune(self) -> None:
        self.pruned_to = bucket_start(self.timeline.last_ts_ns, self.bucket_ns)
        self.kept = _boundary_records(self.kept, self.pruned_to)

    def finish(self, before_open: Callable[[], None] | None = None) -> Checkpoint | None:
        """`before_open`: called once every final record is out, before the open ones (if any)."""
        state = self.timeline
        if state.closed is not None or state.transport_end is not None:
            state.end()  # its records are final: nothing to carry
            self.no_checkpoint = "ended"
            self._verify(())
            return None
        state = _detached(state)
        provisional = _ended_copy(state)
        self._verify(provisional)
        if self.fallback is not None:
            return None
        if before_open is not None:
            before_open()
        for record in provisional:
            self.out(record)
        boundary_ns = bucket_start(state.last_ts_ns, self.bucket_ns)
        if self.pruned_to is not None and boundary_ns < self.pruned_to:
            self.no_checkpoint = "frame times went back past records already dropped"
            return None
        live = {(x.channel, x.incarnation) for x in provisional if isinstance(x, r.ChannelFacts)}
        kept = tuple(x for x in _boundary_records(_newest(self.kept + provisional), boundary_ns)
                     if (x.channel, x.incarnation) in live)
        return Checkpoint(state, tuple(provisional), kept, boundary_ns)

    def _verify(self, provisional: list) -> None:
        """Before the open records go out: ResumedConnection checks that its carry was exact."""


class ResumedConnection(WholeConnection):
    """A connection carried on from its checkpoint (None: new to this run), streamed as
    WholeConnection streams one: the records of its new frames go to `out` as they become final,
    the open ones at `finish()`. What it checks on the way makes patching the stored rows exact;
    `fallback` says why it cannot be (the caller then analyses the connection whole and drops
    whatever came out of it here). Then `stale` are the last run's provisional records (rows to
    delete first), and `touched` the incarnations whose channel_metrics from `boundary_ns` on are
    computed again (`boundary_ns` None: a connection new to the run, all their buckets)."""

    def __init__(self, checkpoint: Checkpoint | None, connection_id: str, agent_id: str | None, out,
                 bucket_ns: int, overdue_ns: int = r.DEFAULT_OVERDUE_NS):
        super().__init__(connection_id, agent_id, out, bucket_ns, overdue_ns)
        self.boundary_ns: int | None = None
        self.old: dict = {}
        if checkpoint is not None:
            self.timeline = checkpoint.timeline
            self.timeline.emit = self._emit
            self.boundary_ns = checkpoint.boundary_ns
            self.old = {_key(x): x for x in checkpoint.provisional}
            # Every record open at the last run comes out again (or the carry falls back), so only
            # the final ones of the boundary are carried in: what channel_metrics starts from.
            self.kept = [x for x in checkpoint.boundary if _key(x) not in self.old]
        # Every record the timeline emits lands in `kept` (WholeConnection._emit, or the C hand-off
        # of connection_analysis.py): they are checked there, in order, before each prune and at
        # the end, not one call each as they come out. `kept[:checked]` are checked (or carried in).
        self.checked = len(self.kept)
        self.stale = list(self.old.values())
        self.touched: set = set()
        self.came_out: set = set()   # keys of `old` records out again
        self.facts: set = set()      # incarnations whose ChannelFacts came out
        self.moved: str | None = None  # the first record that would change channel_metrics before the boundary

    def feed(self, row: Mapping) -> None:
        if self.fallback is not None:
            return
        last_seq = self.timeline.last_seq
        if self.rows == 0 and last_seq is not None and row["seq"] <= last_seq:
            self.fallback = f"new frames from seq {row['seq']}, not after the last analysed seq {last_seq}"
        elif self.boundary_ns is not None and row["ts_ns"] < self.boundary_ns:
            self.fallback = f"a new frame (seq {row['seq']}) is older than the carried bucket"
        else:
            super().feed(row)

    def feed_plain(self, rows: list, start: int, stop: int) -> int:
        return start if self.fallback is not None else super().feed_plain(rows, start, stop)

    def _prune(self) -> None:
        self._check_kept()
        super()._prune()
        self.checked = len(self.kept)

    def _check_kept(self) -> None:
        self._check(self.kept[self.checked:])
        self.checked = len(self.kept)

    def _check(self, records: list) -> None:
        touched, facts, came_out, old_records, boundary_ns = self.touched, self.facts, self.came_out, self.old, \
            self.boundary_ns
        for record in records:
            where = (record.channel, record.incarnation)
            touched.add(where)
            if type(record) is r.ChannelFacts:
                facts.add(where)
            old = None
            if old_records:
                key = _key(record)
                old = old_records.get(key)
                if old is not None:
                    came_out.add(key)
            if boundary_ns is not None and self.moved is None:
                self.moved = _moved_before(old, record, boundary_ns)

    def _verify(self, provisional: list) -> None:
        self._check_kept()
        self._check(provisional)
        if len(self.came_out) < len(self.old):
            self.fallback = "a record open at the last run did not come out again"
        elif self.moved is not None:
            self.fallback = self.moved
        elif not self.touched <= self.facts:
            self.fallback = "records of an incarnation whose facts did not come out"


# -- what the stored rows need -----------------------------------------------------------------------

def _key(record) -> tuple:
    """A record's row key within its connection (the tables' sort keys)."""
    if isinstance(record, (r.Delivery, r.Publish)):
        return type(record).__name__, record.seq
    if isinstance(record, r.Violation):
        return "Violation", record.channel, record.incarnation, record.seq, record.kind
    return "ChannelFacts", record.channel, record.incarnation


def _settled_at(record) -> int | None:
    """When an item stops being outstanding for channel_metrics: its settle time, never before itself."""
    if record.settle_ts_ns is None:
        return None
    return max(record.settle_ts_ns, record.ts_ns)


# The columns an item's arrival puts in channel_metrics (counts, whether it is outstanding at all).
_ARRIVAL = {r.Delivery: ("ts_ns", "seq", "method", "no_ack", "redelivered", "consumer_prefetch", "channel_prefetch"),
            r.Publish: ("ts_ns", "seq", "mode", "return_seq")}


def _moved_before(old, new, boundary_ns: int) -> str | None:
    """Why `new` (replacing `old`, None if it is new) would change channel_metrics before the
    boundary bucket; None if it does not. Decided on the record's fields, conservatively: whatever
    an item's arrival counts must be unchanged unless it arrived in the boundary bucket or later,
    and its settling (old and new) must fall there too."""
    if old is None and type(new) in _ARRIVAL:  # a new item (most are): it settles no earlier than it arrives
        if new.ts_ns < boundary_ns:
            return f"{type(new).__name__.lower()} seq {new.seq} arrived before the carried bucket"
        return None
    if old == new:
        return None
    if isinstance(new, r.Violation):
        return None  # not in channel_metrics
    if isinstance(new, r.ChannelFacts):
        ends = [t for x in (old, new) if x is not None for t in (x.end_ts_ns, x.observed_until_ts_ns)
                if t is not None]
        if any(t < boundary_ns for t in ends) or (old is None and new.open_ts_ns < boundary_ns):
            return f"channel {new.channel} incarnation {new.incarnation} ends before the carried bucket"
        return None
    if old is not None and new.ts_ns < boundary_ns:
        same = all(getattr(old, c) == getattr(new, c) for c in _ARRIVAL[type(new)])
        if not same or (old.outcome == r.UNKNOWN) != (new.outcome == r.UNKNOWN):
            return f"what {type(new).__name__.lower()} seq {new.seq} counts on arrival changed"
    settles = [_settled_at(x) for x in (old, new) if x is not None]
    if any(t is not None and t < boundary_ns for t in settles):
        return f"{type(new).__name__.lower()} seq {new.seq} settled before the carried bucket"
    return None


def _newest(records: list) -> list:
    """Deliveries and publishes, the last version of each (later in the list wins)."""
    by_key = {}
    for x in records:
        if isinstance(x, (r.Delivery, r.Publish)):
            by_key[_key(x)] = x
    return list(by_key.values())


def _boundary_records(records: list, boundary_ns: int) -> list:
    """The deliveries and publishes channel_metrics needs for buckets from `boundary_ns` on: those
    arriving or settled from then on, those never settled that count as outstanding (all the later
    buckets' levels hold them; one that never counts, a publish without confirms, adds to its
    arrival's bucket alone), and each incarnation's latest basic.deliver before it. Every prune
    walks every record the pass made since the last: in C where _folds.c reads them all, else
    `python_boundary_records`."""
    if _boundary_in_c is not None:
        kept = _boundary_in_c(records, boundary_ns)
        if kept is not None:
            return kept
    return python_boundary_records(records, boundary_ns)


def python_boundary_records(records: list, boundary_ns: int) -> list:
    """`_boundary_records`, the rule's one statement (the C twin is held to it)."""
    kept, last_deliver = [], {}
    items = (r.Delivery, r.Publish)
    for x in records:
        if not isinstance(x, items):
            continue
        # Once ts_ns is below the boundary, `_settled_at(x) >= boundary_ns` is settle_ts_ns's test
        # alone: written out, as a prune walks every record it keeps (no call per record).
        settle_ts_ns = x.settle_ts_ns
        if x.ts_ns >= boundary_ns or (ever_outstanding(x) if settle_ts_ns is None else settle_ts_ns >= boundary_ns):
            kept.append(x)
        elif isinstance(x, r.Delivery) and x.method == "basic.deliver":
            where = (x.channel, x.incarnation)
            if where not in last_deliver or (x.ts_ns, x.seq) > (last_deliver[where].ts_ns, last_deliver[where].seq):
                last_deliver[where] = x
    return kept + list(last_deliver.values())


# `_boundary_records` in C, for the records it reads (None: not built, or switched off).
_boundary_in_c = folds.boundary_records()


# -- the state as bytes ---------------------------------------------------------------------------------

_CHECKPOINT_KEYS = {"timeline": state.Ref(ConnectionTimeline),
                    "provisional": state.Items("T", state.Rec(tuple(state.RECORDS))),
                    "boundary": state.Items("T", state.Rec(("Delivery", "Publish"))), "boundary_ns": state.INT}
_TIMELINE_ONLY = {"timeline": _CHECKPOINT_KEYS["timeline"]}
_DETECTORS = "detectors"  # a document of its own (see Checkpoint.detectors), stored beside the state


def _detached(timeline: ConnectionTimeline) -> ConnectionTimeline:
    timeline.emit = None
    return timeline


def _ended_copy(timeline: ConnectionTimeline) -> list:
    """The records the data ending now would give, from a copy: the state itself goes on."""
    copy = state.loads(state.dumps({"timeline": timeline}), _TIMELINE_ONLY)["timeline"]
    out: list = []
    copy.emit = out.append
    copy.end()
    return out


def dump(checkpoint: Checkpoint) -> bytes:
    doc = state.to_doc({key: getattr(checkpoint, key) for key in _CHECKPOINT_KEYS})
    doc[_DETECTORS] = checkpoint.detectors
    return state.to_bytes(doc)


def load(data: bytes) -> Checkpoint:
    """The checkpoint `dump` wrote; StateError (with the reason) for anything else. Its detectors'
    document is checked only for being one (analyzer/detectors/state.py reads it)."""
    doc = state.from_bytes(data)
    detectors = doc.pop(_DETECTORS, None) if isinstance(doc, dict) else None
    if detectors is not None and not isinstance(detectors, dict):
        raise StateError("checkpoint detectors is not a document")
    return Checkpoint(**state.from_doc(doc, _CHECKPOINT_KEYS), detectors=detectors)
