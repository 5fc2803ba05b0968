"""The detectors' state as data, for the connection's checkpoint: an incremental run resumes them
as it resumes the state machine, instead of reading the connection's stored history again.

The state is that of the detectors fed the connection's FINAL records (and its frames) only: the
open ones of a run change in the next, so each run feeds them to the state after taking it (see
connection_analysis.py). It is a JSON document of plain values written with the timeline state's
encoding (timeline/state.py), with this package's own classes and version: reading builds fresh
instances of exactly the classes below, setting exactly their fields. Besides the detectors it
names the thresholds they were fed under (unacked_buildup lists the deliveries past them as they
come): state of other thresholds, of another version, damaged or forged is refused with a
`StateError` saying why, and the caller analyses the connection whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from operator import itemgetter

from ..timeline.state import (BOOL, INT, ROW, RECORD_TYPES, SIGNED, STR, Columns, Dict, Items, Keyed, Opt, Rec, Ref,
                              StateError, Tuple, Vocabulary, from_doc, to_doc)
from . import ConnectionDetectors
from .common import Firsts, Tally, nulls_first
from .consumer import (_VIOLATION_FIELDS, Consumes, UnackedBuildup, UnboundedPrefetch, UnknownDeliveryTag,
                       ViolationFirsts, ViolationTally, _Buildup)
from .flow import ChannelFlows, FlowBlocked
from .profile import Profile
from .publisher import (ConfirmNack, LostConfirm, OutOfOrderConfirm, Returns, SynchronousConfirms,
                        UnconfirmedPersistentPublish, UnroutableReturned, _Lockstep)

DETECTORS_VERSION = 3  # 2: the unacked profile's waiting events as two lists, its closed bands kept compact;
# 3: evidence keys and frame fields typed per detector (violations' tallies and each kind's frames a class)
INCARNATION = Tuple((INT, INT))       # (channel, incarnation)
CONSUMER = Tuple((INT, INT, Opt(STR)))  # (channel, incarnation, consumer tag)
# An evidence item: fields of a record or a frame row, by name.
ITEM = Columns({**ROW.types, **{name: kind.of if isinstance(kind, Opt) else kind
                                for types in RECORD_TYPES.values() for name, kind in types.items()}})


def _violation_key(item: dict) -> tuple:
    """UnknownDeliveryTag's sort key of a violation item (consumer.py): every field, nulls first."""
    if set(item) != set(_VIOLATION_FIELDS):
        raise StateError(f"a violation item has fields {sorted(item)}, not {sorted(_VIOLATION_FIELDS)}")
    return nulls_first(item[name] for name in _VIOLATION_FIELDS)


# Firsts' (key, item) pairs: each owner's key made from its item again (a seq, or a violation's
# fields), so a key is of its real type and the item's.
BY_SEQ = Items("L", Keyed(Columns(ITEM.types, frozenset(("seq",))), itemgetter("seq")))
BY_VIOLATION = Items("L", Keyed(Columns({name: RECORD_TYPES["Violation"][name] for name in _VIOLATION_FIELDS}),
                                _violation_key))


def _frames(*fields) -> dict:
    """A FramesByIncarnation's rows, (channel, seq, ts_ns, agent_id, fields), with its owner's fields."""
    return {"rows": Items("L", Tuple((INT, INT, INT, Opt(STR), Tuple(fields))))}


# Every stored field of every class the state holds, with its type. Change one and the encoder
# refuses until this table says so, and tests/test_detector_state.py until the version is bumped.
_TALLIES = {"tallies": Dict(INCARNATION, Ref(Tally))}
_TALLY = {"agent_id": Opt(STR), "n": INT, "first_ns": Opt(INT), "last_ns": Opt(INT)}
FIELDS = {
    LostConfirm: _TALLIES, ConfirmNack: _TALLIES, UnconfirmedPersistentPublish: _TALLIES,
    OutOfOrderConfirm: {**_TALLIES, "most_overtaken": Dict(INCARNATION, Opt(INT))},
    SynchronousConfirms: {"channels": Dict(INCARNATION, Ref(_Lockstep))},
    _Lockstep: {"agent_id": Opt(STR), "n": INT, "lockstep": INT, "first_ns": Opt(INT), "last_ns": Opt(INT),
                "items": Ref(Firsts), "pending": Items("L", Tuple((INT, INT, Opt(INT), BOOL))),
                "latest_confirm_ns": Opt(INT), "idle_ns": Dict(SIGNED, INT)},  # quantiles.py's histogram
    UnroutableReturned: {"frames": Ref(Returns)},
    Returns: _frames(INT, *(Opt(ROW.types[name]) for name in UnroutableReturned.FIELDS[1:])),
    UnboundedPrefetch: {"consumes": Ref(Consumes)},
    Consumes: _frames(INT, Opt(STR)),                 # (seq, queue)
    UnackedBuildup: {"age_limit_ns": INT, "stall_limit_ns": INT, "channels": Dict(INCARNATION, Ref(_Buildup)),
                     "proven": Items("S", CONSUMER), "waiting": Dict(CONSUMER, Items("L", Rec(("Delivery",))))},
    _Buildup: {"agent_id": Opt(STR), "oldest_ns": Opt(SIGNED), "oldest": Opt(Tuple((INT, INT))), "by_age": Ref(Tally),
               "by_stall": Ref(Tally), "channel_scope": Ref(Profile), "consumer_scopes": Dict(STR, Ref(Profile))},
    Profile: {"limit": Opt(INT), "end_ns": Opt(INT), "keys": Items("L", INT), "times": Items("L", INT),
              "running": INT, "peak": Opt(INT), "last_time": Opt(INT),
              "stack": Items("L", Tuple((INT, INT, Opt(INT)), "L")),   # [level, since, latest following]
              "closed": Items("L", Tuple((INT, INT, INT), "L"))},      # [lo, hi, stall]
    UnknownDeliveryTag: {"tallies": Dict(INCARNATION, Ref(ViolationTally))},
    FlowBlocked: {"connection_signals": Items("L", Tuple((INT, INT, Opt(STR), BOOL, BOOL, Opt(STR)))),
                  "channel_flows": Ref(ChannelFlows)},
    ChannelFlows: _frames(BOOL, BOOL),                # (stops, resumes)
    Tally: {**_TALLY, "items": Ref(Firsts)},
    ViolationTally: {**_TALLY, "items": Ref(ViolationFirsts)},
    Firsts: {"_items": BY_SEQ},
    ViolationFirsts: {"_items": BY_VIOLATION},
}
# The thresholds are the run's, set again on reading (and checked against those stored by name).
NOT_STORED = {UnackedBuildup: ("thresholds",)}
VOCABULARY = Vocabulary("ackscope.detectors.state", DETECTORS_VERSION, FIELDS, NOT_STORED)
# ConnectionDetectors' attributes that are state (the rest it builds from these).
PARTS = ("lost", "nacked", "out_of_order", "persistent", "synchronous", "returned", "buildup", "unbounded",
         "violations", "flow")
CHANNELS = "channels"        # the context's ChannelFacts of ended incarnations
THRESHOLDS = "thresholds"


def to_state(detectors: ConnectionDetectors) -> dict:
    """The document of `detectors`' state (JSON-ready)."""
    top = {part: getattr(detectors, part) for part in PARTS}
    top[CHANNELS] = detectors.context.channels
    top[THRESHOLDS] = thresholds_text(detectors.context.thresholds)
    return to_doc(top, VOCABULARY)


def from_state(doc, connection: dict, thresholds) -> ConnectionDetectors:
    """Detectors resumed from a document `to_state` wrote under these thresholds; StateError otherwise."""
    detectors = ConnectionDetectors(connection, thresholds)
    parts = from_doc(doc, {**{part: Ref(type(getattr(detectors, part))) for part in PARTS},
                           CHANNELS: Dict(INCARNATION, Rec(("ChannelFacts",))), THRESHOLDS: STR}, VOCABULARY)
    if parts[THRESHOLDS] != thresholds_text(thresholds):
        raise StateError("the detectors' state was built under other thresholds")
    for part in PARTS:
        setattr(detectors, part, parts[part])
    detectors.buildup.thresholds = thresholds
    detectors.context.channels = parts[CHANNELS]
    detectors.rewired()
    _check_items(detectors)
    return detectors


def _check_items(detectors: ConnectionDetectors) -> None:
    """Each evidence item holds exactly the fields its owner writes: Firsts' items are typed field by
    field (ITEM), and one missing a field would fail, or list other values, when its finding is made."""
    owners = [(type(kind).__name__, kind.tallies.values(), ("seq", *kind.fields))
              for kind in detectors._by_publish if hasattr(kind, "fields")]  # the per-incarnation kinds
    owners.append(("_Lockstep", detectors.synchronous.channels.values(), _Lockstep.ITEM_FIELDS))
    owners.append(("_Buildup", [t for b in detectors.buildup.channels.values() for t in (b.by_age, b.by_stall)],
                   _Buildup.ITEM_FIELDS))
    for owner, holders, fields in owners:
        for holder in holders:
            for _, item in holder.items._items:
                if item.keys() != set(fields):
                    raise StateError(f"an evidence item of {owner} has fields {list(item)}, not {list(fields)}")


def thresholds_text(thresholds) -> str:
    return json.dumps(asdict(thresholds), sort_keys=True)
