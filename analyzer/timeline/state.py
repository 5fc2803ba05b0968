"""The state machine's state as data: what a checkpoint stores between analysis runs.

A connection's state is a small graph: the connection, its channel incarnations, the deliveries
and publishes still open (a publish can wait in two places at once, for its confirm and for a
basic.return, so identity matters), the frame rows they came from and records held back. It is
written as JSON of plain values, never as pickled objects: reading it builds fresh instances of the
state classes below, setting exactly their declared fields, and nothing else. A lake's bytes
cannot run code, reach a module, or change a class. Every field is read against its type (FIELDS):
JSON kind, integer range, the closed set of strings the machine compares, the class an object
reference must be; a damaged or forged checkpoint (a value of another type, past int64 or below
zero, nested too deep, a key missing or added) is refused with a `StateError` naming the field,
and the caller analyses that connection whole, never crashes on it later.

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
import reprlib
from dataclasses import dataclass, field

import pyarrow as pa

from .. import schema

from . import records as r
from .channel import TO_BROKER, TO_CLIENT, ChannelLife
from .connection import ConnectionTimeline
from .consumer import ConsumerSide, _Delivery, _EarlyAck
from .plain import Row
from .tables import INPUT_COLUMNS
from .publisher import PublisherSide, _Publish

FORMAT_NAME = "ackscope.timeline.state"
# 2: the checkpoint carries the detectors' state. 3: an incarnation owns its consumer and publisher
# sides (objects of their own) instead of inheriting them.
STATE_VERSION = 3
FORMAT = f"{FORMAT_NAME}/{STATE_VERSION}"  # the analysis_state table's `format` column

class StateError(ValueError):
    """A checkpoint this code cannot read: damaged, forged, or of another version (not the caller's bug)."""


# -- what a stored value may be, checked as it is read ----------------------------------------------
# Every stored field has a type below; the reader builds a value only if the JSON matches it in
# type and range (ints non-negative and within int64 unless declared signed, strings of a closed
# set where the machine compares them to constants). A value of the wrong type would crash a later
# comparison (`"93" <= 94`), an int past int64 a table write, and a negative tag or an unknown
# outcome would give wrong rows: each is refused here, with the field it was found in.

INT64_MAX = (1 << 63) - 1


class Type:
    def read(self, reader: "_Reader", v):
        raise NotImplementedError

    def complete(self, encoded):
        """The writer's encoded value as this type reads it whole: a frame row holds every column
        the reader requires present (`Columns.present`), null where the row lacked it."""
        return encoded


@dataclass(frozen=True)
class Int(Type):
    low: int = 0
    high: int = INT64_MAX

    def read(self, reader, v):
        if type(v) is not int or not self.low <= v <= self.high:
            raise StateError(f"{_short(v)} is not an integer in [{self.low}, {self.high}]")
        return v


@dataclass(frozen=True)
class Plain(Type):
    kind: type  # bool or str

    def read(self, reader, v):
        if type(v) is not self.kind:
            raise StateError(f"{_short(v)} is not a {self.kind.__name__}")
        return v


@dataclass(frozen=True)
class OneOf(Type):
    values: frozenset

    def read(self, reader, v):
        if type(v) is not str or v not in self.values:
            raise StateError(f"{_short(v)} is not one of {sorted(self.values)}")
        return v


@dataclass(frozen=True)
class Opt(Type):
    of: Type

    def read(self, reader, v):
        return None if v is None else self.of.read(reader, v)

    def complete(self, encoded):
        return None if encoded is None else self.of.complete(encoded)


@dataclass(frozen=True)
class AnyOf(Type):
    types: tuple

    def read(self, reader, v):
        reasons = []
        for t in self.types:
            try:
                return t.read(reader, v)
            except StateError as refused:
                reasons.append(str(refused))
        raise StateError(" and ".join(reasons))


def _body(v, tag: str):
    if not (type(v) is list and len(v) == 2 and v[0] == tag):
        raise StateError(f"{_short(v)} is not a [{tag!r}, ...] value")
    return v[1]


@dataclass(frozen=True)
class Items(Type):
    """A list ("L"), tuple ("T") or set ("S") of values of one type."""
    tag: str
    of: Type

    def read(self, reader, v):
        body = _body(v, self.tag)
        if type(body) is not list:
            raise StateError(f"{_short(v)} is malformed")
        items = [self.of.read(reader, x) for x in body]
        return items if self.tag == "L" else tuple(items) if self.tag == "T" else _set(items)

    def complete(self, encoded):
        return [encoded[0], [self.of.complete(x) for x in encoded[1]]]


@dataclass(frozen=True)
class Tuple(Type):
    """A tuple (or with tag "L", a list) of so many values, each of its own type."""
    of: tuple
    tag: str = "T"

    def read(self, reader, v):
        body = _body(v, self.tag)
        if type(body) is not list or len(body) != len(self.of):
            raise StateError(f"{_short(v)} is not a tuple of {len(self.of)}")
        items = [t.read(reader, x) for t, x in zip(self.of, body)]
        return tuple(items) if self.tag == "T" else items

    def complete(self, encoded):
        return [encoded[0], [t.complete(x) for t, x in zip(self.of, encoded[1])]]


@dataclass(frozen=True)
class Keyed(Type):
    """A (sort key, item) pair whose key its owner makes from the item (`key_of`): the item is read
    against its type and the key made again from it, so a key that is not the item's is refused
    and the one compared is always of the key's real type."""
    item: Type
    key_of: object  # item -> key (plain values and tuples); StateError if the item cannot have one

    def read(self, reader, v):
        body = _body(v, "T")
        if type(body) is not list or len(body) != 2:
            raise StateError(f"{_short(v)} is not a (key, item) pair")
        item = self.item.read(reader, body[1])
        key = self.key_of(item)
        if body[0] != _Writer(TIMELINE).value(key):
            raise StateError(f"key {_short(body[0])} is not its item's ({_short(key)})")
        return key, item


@dataclass(frozen=True)
class Dict(Type):
    key: Type
    value: Type

    def read(self, reader, v):
        if type(v) is list and v and v[0] == "M":  # string keys (or none: the writer's empty dict)
            body = _body(v, "M")
            if type(body) is not dict:
                raise StateError(f"{_short(v)} is malformed")
            pairs = body.items()
        else:
            body = _body(v, "D")
            if type(body) is not list or not all(type(p) is list and len(p) == 2 for p in body):
                raise StateError(f"{_short(v)} is malformed")
            pairs = body
        out = {}
        for key, value in pairs:
            key = self.key.read(reader, key)
            if key in out:
                raise StateError(f"key {_short(key)} twice")
            out[key] = self.value.read(reader, value)
        return out

    def complete(self, encoded):
        if encoded[0] == "M":
            return ["M", {key: self.value.complete(value) for key, value in encoded[1].items()}]
        return [encoded[0], [[key, self.value.complete(value)] for key, value in encoded[1]]]


@dataclass(frozen=True)
class Columns(Type):
    """A dict of named values (a frame row, a violation, an evidence item): each name one of
    `types`', its value null or of that type; `required` must be there and not null, `present`
    must be there (null or not: a name left out would read as null, a value the writer never
    wrote). Any other name must be null (the pass's rows carry its header rows' columns, null on a
    frame)."""
    types: dict = field(hash=False)
    required: frozenset = frozenset()
    present: frozenset = frozenset()

    def read(self, reader, v):
        body = _body(v, "M")
        if type(body) is not dict:
            raise StateError(f"{_short(v)} is malformed")
        out = {}
        for name, value in body.items():
            kind = self.types.get(name)
            if kind is None:
                if value is not None:
                    raise StateError(f"unknown column {_short(name)}")
                out[name] = None
                continue
            try:
                out[name] = None if value is None and name not in self.required else kind.read(reader, value)
            except StateError as refused:
                raise StateError(f"{name}: {refused}") from None
        missing = (self.required | self.present) - set(out)
        if missing:
            raise StateError(f"columns {sorted(missing)} missing")
        return out

    def complete(self, encoded):
        absent = self.present - set(encoded[1])
        return ["M", {**encoded[1], **dict.fromkeys(sorted(absent))}] if absent else encoded


@dataclass(frozen=True)
class Ref(Type):
    """An object of the document's `objects` (shared: every reference is the same instance)."""
    cls: type

    def read(self, reader, v):
        return reader.object(v, self.cls)


@dataclass(frozen=True)
class Rec(Type):
    """A record (records.py) of one of these classes: a value, so copied."""
    names: tuple

    def read(self, reader, v):
        if not (type(v) is list and len(v) == 3 and v[0] == "R" and v[1] in self.names and type(v[2]) is list):
            raise StateError(f"{_short(v)} is not a record of {'/'.join(self.names)}")
        types = RECORD_TYPES[v[1]]
        if len(v[2]) != len(types):
            raise StateError(f"record {v[1]} has {len(v[2])} fields, not {len(types)}")
        values = []
        for (name, kind), x in zip(types.items(), v[2]):
            try:
                values.append(kind.read(reader, x))
            except StateError as refused:
                raise StateError(f"{v[1]}.{name}: {refused}") from None
        return RECORDS[v[1]](*values)


INT, SIGNED, BOOL, STR = Int(), Int(-INT64_MAX - 1), Plain(bool), Plain(str)
DIRECTION = OneOf(frozenset((TO_BROKER, TO_CLIENT)))
# Fields whose values the machine compares with its constants.
_CLOSED_SETS = {
    "outcome": OneOf(frozenset(r.DELIVERY_OUTCOMES + r.PUBLISH_OUTCOMES)), "mode": OneOf(frozenset(r.PUBLISH_MODES)),
    "kind": OneOf(frozenset(r.VIOLATION_KINDS)), "evidence": OneOf(frozenset((r.FROM_CAPTURE, r.FROM_BROKER))),
    "direction": DIRECTION}
# Differences of two times: the only integers that may be negative.
_SIGNED = ("settle_latency_ns",)


def _annotated(name: str, annotation: str) -> Type:
    """A record field's type from its annotation (records.py: int, str, bool, each maybe `| None`)."""
    base, _, none = annotation.partition(" | ")
    kind = SIGNED if name in _SIGNED else _CLOSED_SETS.get(name) or {"int": INT, "str": STR, "bool": BOOL}[base]
    return Opt(kind) if none == "None" else kind


RECORDS = {cls.__name__: cls for cls in (r.Delivery, r.Publish, r.ChannelFacts, r.Violation)}
RECORD_TYPES = {name: {f.name: _annotated(f.name, f.type) for f in dataclasses.fields(cls)}
                for name, cls in RECORDS.items()}  # in field order
RECORD_FIELDS = {name: tuple(types) for name, types in RECORD_TYPES.items()}


def _arrow_type(name: str, arrow) -> Type:
    if name in _CLOSED_SETS:
        return _CLOSED_SETS[name]
    if arrow == pa.int32():
        return Int(0, (1 << 31) - 1)
    return INT if arrow == pa.int64() else BOOL if arrow == pa.bool_() else STR


# A frame row as the machine holds it: any frames column (schema.FRAMES), these ones never null,
# and every column the timelines read there (the pass's rows have them all: ANALYSIS_COLUMNS).
ROW = Columns({f.name: _arrow_type(f.name, f.type) for f in schema.FRAMES if f.name not in ("date", "ts")},
              frozenset(("seq", "ts_ns", "channel", "direction", "method")), frozenset(INPUT_COLUMNS))
OUTCOME, MODE = _CLOSED_SETS["outcome"], _CLOSED_SETS["mode"]
CONSUMER = Tuple((Opt(STR), Opt(BOOL), Opt(INT)))   # (queue, no_ack, consumer prefetch)

# Every field of every state object, with its type. `emit` (where records go) is the caller's, never stored.
FIELDS = {
    ConnectionTimeline: {
        "id": STR, "agent_id": Opt(STR), "overdue_ns": INT, "lives": Dict(INT, Ref(ChannelLife)),
        "incarnations": Dict(INT, INT), "synchronised": Items("S", DIRECTION), "closed": Opt(ROW),
        "transport_end": Opt(ROW), "blocked_since_ns": Opt(INT), "last_seq": Opt(INT), "last_ts_ns": Opt(INT),
        "finished": BOOL, "awaiting_next": Items("L", Tuple((Ref(ChannelLife), BOOL)))},
    ChannelLife: {  # the incarnation (channel.py)
        "connection": Ref(ConnectionTimeline), "channel": INT, "incarnation": INT, "open_row": ROW,
        "history_known": BOOL, "gap_seen": BOOL, "gap_since_end": BOOL, "ended": Opt(Tuple((Opt(ROW), OUTCOME))),
        "end_facts": Columns(RECORD_TYPES["ChannelFacts"]), "holding": Opt(DIRECTION),
        "held": Items("L", Rec(tuple(RECORDS))), "tx_unanswered": INT, "consumer": Ref(ConsumerSide),
        "publisher": Ref(PublisherSide)},
    ConsumerSide: {
        "life": Ref(ChannelLife), "consumers": Dict(STR, CONSUMER), "cancelled": Items("S", STR),
        "pending_consume": Opt(CONSUMER), "pending_get": Opt(Tuple((Opt(STR), BOOL))),
        "outstanding": Dict(INT, Ref(_Delivery)),
        # (delivery, outcome, frame row, multiple, requeue)
        "tx_settled": Items("L", Tuple((Ref(_Delivery), OUTCOME, ROW, Opt(BOOL), Opt(BOOL)))),
        "early": Items("L", Ref(_EarlyAck)), "proven_manual": Items("S", STR), "first_tag": INT, "max_tag": INT,
        "consumer_prefetch": Opt(INT), "channel_prefetch": Opt(INT), "unacked": INT, "peak_unacked": INT,
        "consumes": INT, "unbounded_manual_consumes": INT, "deliveries": INT,
        "violations": Items("L", Columns(RECORD_TYPES["Violation"])), "refusing": BOOL, "refused": BOOL},
    PublisherSide: {
        "life": Ref(ChannelLife), "confirm": Opt(BOOL), "tx": Opt(BOOL), "aligned": BOOL, "next_confirm": INT,
        "pending": Dict(INT, Ref(_Publish)), "tx_publishes": Items("L", Ref(_Publish)),
        "discarded": Items("L", Ref(_Publish)), "awaiting_return": Dict(INT, Ref(_Publish)),
        "early_confirms": Dict(INT, ROW), "early_multiple": Opt(Tuple((INT, ROW))), "answered_select": Opt(BOOL),
        "publishes": INT},
    _Delivery: {"row": ROW, "tag": INT, "consumer_tag": Opt(STR), "queue": Opt(STR), "no_ack": Opt(BOOL),
                "consumer_prefetch": Opt(INT), "channel_prefetch": Opt(INT)},
    _Publish: {"row": ROW, "mode": MODE, "confirm_seq": Opt(INT), "pending_before": Opt(INT), "outcome": Opt(OUTCOME),
               "settle": Opt(Tuple((Opt(INT), Opt(INT)))), "confirm": Opt(Tuple((INT, Opt(BOOL)))),
               "out_of_order_by": Opt(INT), "returned": Opt(ROW), "observed_until": Opt(INT)},
    _EarlyAck: {"row": ROW, "tag": INT, "multiple": BOOL, "kind": _CLOSED_SETS["kind"], "where": Opt(Ref(ChannelLife))},
}
NOT_STORED = {ConnectionTimeline: ("emit",)}


@dataclass(frozen=True)
class Vocabulary:
    """What one kind of state document may hold: its format name and version, its state classes
    with their stored fields and each field's type, and the fields left out (the caller sets them again)."""
    name: str
    version: int
    fields: dict
    not_stored: dict

    @property
    def classes(self) -> dict:
        return {cls.__name__: cls for cls in self.fields}


TIMELINE = Vocabulary(FORMAT_NAME, STATE_VERSION, FIELDS, NOT_STORED)
CLASSES = TIMELINE.classes


def to_doc(top: dict, vocabulary: Vocabulary = TIMELINE) -> dict:
    """`top`: a dict of str -> value (the state objects, records, containers) as a JSON-ready document."""
    writer = _Writer(vocabulary)
    body = {key: writer.value(value) for key, value in top.items()}
    return {"format": vocabulary.name, "version": vocabulary.version, "objects": writer.objects, **body}


def from_doc(doc, keys: dict, vocabulary: Vocabulary = TIMELINE) -> dict:
    """The dict `to_doc` was given, for exactly these keys (key -> its Type), with fresh objects;
    StateError if it cannot be."""
    if not isinstance(doc, dict) or doc.get("format") != vocabulary.name:
        raise StateError(f"not a checkpoint of {vocabulary.name}")
    if doc.get("version") != vocabulary.version:
        raise StateError(f"{vocabulary.name} version {_short(doc.get('version'))}; this code reads version "
                         f"{vocabulary.version}")
    extra = set(doc) - set(keys) - {"format", "version", "objects"}
    if extra or any(key not in doc for key in (*keys, "objects")):
        raise StateError(f"checkpoint fields {_short(sorted(set(doc) - {'format', 'version', 'objects'}))}, "
                         f"expected {sorted(keys)} and objects")
    try:
        reader = _Reader(doc["objects"], vocabulary)
        return {key: reader.field(key, kind, doc[key]) for key, kind in keys.items()}
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


def loads(data: bytes, keys: dict, vocabulary: Vocabulary = TIMELINE) -> dict:
    return from_doc(from_bytes(data), keys, vocabulary)


_PLAIN = (type(None), bool, int, float, str)


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
        entry[1] = {f: kind_of.complete(self.value(getattr(obj, f))) for f, kind_of in stored.items()}
        return number


class _Reader:
    """Builds every object of the document first, empty, so references resolve in any order; then
    each field from its value, checked against its type."""

    def __init__(self, objects, vocabulary: Vocabulary):
        if not isinstance(objects, list):
            raise StateError("checkpoint objects must be a list")
        classes, known = vocabulary.classes, vocabulary.fields
        self.built: list = []
        for n, entry in enumerate(objects):
            if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is str and entry[0] in classes
                    and isinstance(entry[1], dict)):
                raise StateError(f"checkpoint object {n} is not [state class, fields]")
            cls = classes[entry[0]]
            if set(entry[1]) != set(known[cls]):
                raise StateError(f"checkpoint object {n} ({entry[0]}) has fields {_short(sorted(entry[1]))}, "
                                 f"expected {sorted(known[cls])}")
            self.built.append(cls.__new__(cls))
        for obj, (name, fields) in zip(self.built, objects):
            types = known[type(obj)]
            for field_name, value in fields.items():
                setattr(obj, field_name, self.field(f"{name}.{field_name}", types[field_name], value))
            for field_name in vocabulary.not_stored.get(type(obj), ()):
                setattr(obj, field_name, None)

    def field(self, name: str, kind: Type, value):
        try:
            return kind.read(self, value)
        except StateError as refused:
            raise StateError(f"checkpoint {name}: {refused}") from None

    def object(self, v, cls: type):
        if not (type(v) is list and len(v) == 2 and v[0] == "O" and type(v[1]) is int
                and 0 <= v[1] < len(self.built)):
            raise StateError(f"{_short(v)} is not an object reference")
        obj = self.built[v[1]]
        if type(obj) is not cls:
            raise StateError(f"object {v[1]} is a {type(obj).__name__}, not a {cls.__name__}")
        return obj


def _set(items: list) -> set:
    for item in items:
        try:
            hash(item)
        except TypeError:
            raise StateError(f"set member {_short(item)} is not hashable") from None
    return set(items)


# A value as a reason shows it: bounded however large or deep it is.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 3, 40, 40, 40


def _short(v) -> str:
    return _SHORT.repr(v)
