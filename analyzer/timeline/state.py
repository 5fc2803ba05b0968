"""The state machine's state as data: what a checkpoint stores between analysis runs.

A connection's state is a small graph: the connection, its channel incarnations, the deliveries
and publishes still open (a publish can wait in two places at once, for its confirm and for a
basic.return, so identity matters), the frame rows they came from and records held back. It is
written as JSON of plain values, never as pickled objects: reading it builds fresh instances of the
five state classes below, setting exactly their declared fields, and nothing else. A lake's bytes
cannot run code, reach a module, or change a class; a damaged or forged checkpoint is refused with
a `StateError` saying why, and the caller analyses that connection whole.

The encoding, one JSON value per Python value:
- None, bool, int, float, str: themselves;
- ["M", {str: value}] a dict with string keys (frame rows), ["D", [[key, value], ...]] any other
  dict, ["L", [...]] a list, ["T", [...]] a tuple, ["S", [...]] a set;
- ["R", name, [values in field order]] a record (records.py: Delivery, Publish, ChannelFacts,
  Violation), a value, so copied;
- ["O", n] the n-th object of the checkpoint's `objects` table, each [class name, {field: value}]:
  an object, so shared.

`STATE_VERSION` names the shape: the state classes and their fields (`FIELDS`). Change a field and
tests/test_state.py fails until FIELDS says so and the version is bumped (the encoder also refuses
an object that gained an attribute FIELDS does not list); a checkpoint of another version is not
read (its connection is analysed whole once). Fields come from these tables, never from a class's
`__slots__`: the same code reads and writes the state of a compiled build.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass

from . import records as r
from .channel import ChannelLife
from .connection import ConnectionTimeline
from .consumer import ConsumerSide, _Delivery, _EarlyAck
from .plain import Row
from .publisher import PublisherSide, _Publish

FORMAT_NAME = "ackscope.timeline.state"
# 2: the checkpoint carries the detectors' state. 3: an incarnation owns its consumer and publisher
# sides (objects of their own) instead of inheriting them.
STATE_VERSION = 3
FORMAT = f"{FORMAT_NAME}/{STATE_VERSION}"  # the analysis_state table's `format` column

# Every field of every state object. `emit` (where records go) is the caller's, never stored.
FIELDS = {
    ConnectionTimeline: (
        "id", "agent_id", "overdue_ns", "lives", "incarnations", "synchronised", "closed", "transport_end",
        "blocked_since_ns", "last_seq", "last_ts_ns", "finished", "awaiting_next"),
    ChannelLife: (  # the incarnation (channel.py)
        "connection", "channel", "incarnation", "open_row", "history_known", "gap_seen", "gap_since_end",
        "ended", "end_facts", "holding", "held", "tx_unanswered", "consumer", "publisher"),
    ConsumerSide: (
        "life", "consumers", "cancelled", "pending_consume", "pending_get", "outstanding", "tx_settled", "early",
        "proven_manual", "first_tag", "max_tag", "consumer_prefetch", "channel_prefetch", "unacked",
        "peak_unacked", "consumes", "unbounded_manual_consumes", "deliveries", "violations", "refusing", "refused"),
    PublisherSide: (
        "life", "confirm", "tx", "aligned", "next_confirm", "pending", "tx_publishes", "discarded",
        "awaiting_return", "early_confirms", "early_multiple", "answered_select", "publishes"),
    _Delivery: ("row", "tag", "consumer_tag", "queue", "no_ack", "consumer_prefetch", "channel_prefetch"),
    _Publish: ("row", "mode", "confirm_seq", "pending_before", "outcome", "settle", "confirm", "out_of_order_by",
               "returned", "observed_until"),
    _EarlyAck: ("row", "tag", "multiple", "kind", "where"),
}
NOT_STORED = {ConnectionTimeline: ("emit",)}
RECORDS = {cls.__name__: cls for cls in (r.Delivery, r.Publish, r.ChannelFacts, r.Violation)}
RECORD_FIELDS = {name: tuple(f.name for f in dataclasses.fields(cls)) for name, cls in RECORDS.items()}  # in order
_PLAIN = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Vocabulary:
    """What one kind of state document may hold: its format name and version, its state classes
    with their stored fields, and the fields left out (the caller sets them again)."""
    name: str
    version: int
    fields: dict
    not_stored: dict

    @property
    def classes(self) -> dict:
        return {cls.__name__: cls for cls in self.fields}


TIMELINE = Vocabulary(FORMAT_NAME, STATE_VERSION, FIELDS, NOT_STORED)
CLASSES = TIMELINE.classes


class StateError(ValueError):
    """A checkpoint this code cannot read: damaged, forged, or of another version (not the caller's bug)."""


def to_doc(top: dict, vocabulary: Vocabulary = TIMELINE) -> dict:
    """`top`: a dict of str -> value (the state objects, records, containers) as a JSON-ready document."""
    writer = _Writer(vocabulary)
    body = {key: writer.value(value) for key, value in top.items()}
    return {"format": vocabulary.name, "version": vocabulary.version, "objects": writer.objects, **body}


def from_doc(doc, keys: Iterable[str], vocabulary: Vocabulary = TIMELINE) -> dict:
    """The dict `to_doc` was given, for exactly these keys, with fresh objects; StateError if it cannot be."""
    if not isinstance(doc, dict) or doc.get("format") != vocabulary.name:
        raise StateError(f"not a checkpoint of {vocabulary.name}")
    if doc.get("version") != vocabulary.version:
        raise StateError(f"{vocabulary.name} version {doc.get('version')!r}; this code reads version "
                         f"{vocabulary.version}")
    keys = tuple(keys)
    extra = set(doc) - set(keys) - {"format", "version", "objects"}
    if extra or any(key not in doc for key in keys):
        raise StateError(f"checkpoint fields {sorted(set(doc) - {'format', 'version', 'objects'})}, "
                         f"expected {sorted(keys)}")
    try:
        reader = _Reader(doc["objects"], vocabulary)
        return {key: reader.value(doc[key]) for key in keys}
    except RecursionError:
        raise StateError("checkpoint nested too deeply") from None


def dumps(top: dict, vocabulary: Vocabulary = TIMELINE) -> bytes:
    return to_bytes(to_doc(top, vocabulary))


def to_bytes(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def from_bytes(data: bytes):
    try:
        return json.loads(data)
    except (ValueError, RecursionError, TypeError) as exc:
        raise StateError(f"not a checkpoint: {exc}") from None


def loads(data: bytes, keys: Iterable[str], vocabulary: Vocabulary = TIMELINE) -> dict:
    return from_doc(from_bytes(data), keys, vocabulary)


class _Writer:
    def __init__(self, vocabulary: Vocabulary):
        self.fields, self.not_stored = vocabulary.fields, vocabulary.not_stored
        self.objects: list = []
        self.ids: dict[int, int] = {}

    def value(self, v):
        kind = type(v)
        if kind in _PLAIN:
            return v
        if kind is dict or kind is Row:  # a frame row (plain.Row) is stored as the dict it equals
            if all(type(k) is str for k in v):
                return ["M", {k: self.value(x) for k, x in v.items()}]
            return ["D", [[self.value(k), self.value(x)] for k, x in v.items()]]
        if kind is list:
            return ["L", [self.value(x) for x in v]]
        if kind is tuple:
            return ["T", [self.value(x) for x in v]]
        if kind is set:
            return ["S", [self.value(x) for x in sorted(v, key=repr)]]
        if kind.__name__ in RECORDS and RECORDS[kind.__name__] is kind:
            return ["R", kind.__name__, [self.value(getattr(v, f)) for f in RECORD_FIELDS[kind.__name__]]]
        if kind in self.fields:
            return ["O", self._object(v)]
        raise TypeError(f"a checkpoint cannot hold a {kind.__name__}")

    def _object(self, obj) -> int:
        known = self.ids.get(id(obj))
        if known is not None:
            return known
        kind = type(obj)
        stored = self.fields[kind]
        # A slotted (or compiled) class cannot gain an attribute; one with a __dict__ can.
        present = getattr(obj, "__dict__", None)
        if present is not None:
            present = set(present) - set(self.not_stored.get(kind, ()))
            if present != set(stored):
                raise TypeError(f"{kind.__name__} has fields {sorted(present ^ set(stored))} that its FIELDS "
                                f"table does not list (or lists and it lacks): update FIELDS and the version")
        number = self.ids[id(obj)] = len(self.objects)
        entry = [kind.__name__, None]
        self.objects.append(entry)  # before its fields: they may refer back to it
        entry[1] = {f: self.value(getattr(obj, f)) for f in stored}
        return number


class _Reader:
    def __init__(self, objects, vocabulary: Vocabulary):
        if not isinstance(objects, list):
            raise StateError("checkpoint objects must be a list")
        classes, known = vocabulary.classes, vocabulary.fields
        self.raw = objects
        self.built: list = []
        for n, entry in enumerate(objects):  # every object first, empty, so references resolve in any order
            if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in classes and isinstance(entry[1], dict)):
                raise StateError(f"checkpoint object {n} is not [state class, fields]")
            cls = classes[entry[0]]
            if set(entry[1]) != set(known[cls]):
                raise StateError(f"checkpoint object {n} ({entry[0]}) has fields {sorted(entry[1])}, "
                                 f"expected {sorted(known[cls])}")
            self.built.append(cls.__new__(cls))
        for obj, (_, fields) in zip(self.built, objects):
            for name, value in fields.items():
                setattr(obj, name, self.value(value))
            for name in vocabulary.not_stored.get(type(obj), ()):
                setattr(obj, name, None)

    def value(self, v):
        if type(v) in _PLAIN:
            return v
        if not (isinstance(v, list) and v and isinstance(v[0], str)):
            raise StateError(f"checkpoint value {_short(v)} is not tagged")
        tag = v[0]
        if tag == "O" and len(v) == 2 and type(v[1]) is int and 0 <= v[1] < len(self.built):
            return self.built[v[1]]
        if tag == "R" and len(v) == 3 and v[1] in RECORDS and isinstance(v[2], list):
            cls = RECORDS[v[1]]
            if len(v[2]) != len(RECORD_FIELDS[v[1]]) or not all(type(x) in _PLAIN for x in v[2]):
                raise StateError(f"checkpoint record {v[1]} has {len(v[2])} fields or values that are not plain")
            return cls(*v[2])
        if len(v) != 2:
            raise StateError(f"checkpoint value {_short(v)} is malformed")
        body = v[1]
        if tag == "M" and isinstance(body, dict):
            return {k: self.value(x) for k, x in body.items()}
        if tag in ("L", "T", "S") and isinstance(body, list):
            items = [self.value(x) for x in body]
            return items if tag == "L" else tuple(items) if tag == "T" else set(_hashable(items))
        if tag == "D" and isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body):
            return {key: self.value(x) for key, x in ((_hashable([self.value(k)])[0], x) for k, x in body)}
        raise StateError(f"checkpoint value {_short(v)} is malformed")


def _hashable(items: list) -> list:
    for item in items:
        try:
            hash(item)
        except TypeError:
            raise StateError(f"checkpoint key or set member {_short(item)} is not hashable") from None
    return items


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
