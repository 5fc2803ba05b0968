"""The per-record folds in C: what channel_metrics (timeline/metrics.py, `ChannelMetrics._delivery`
and `_publish`), unacked_buildup (detectors/consumer.py, `UnackedBuildup.add`) and the publish
detectors (detectors/__init__.py, `ConnectionDetectors.python_publish`: synchronous_confirms'
`add` for a publish no other kind counts) do with each delivery and publish record, done by
_folds.c as their Python does it.

Why: after the machine's plain frames went to C (timeline/plain.py), these two folds were half of
the connection pass's Python (bench/README.md, session 39): a few counters, two lists and a dict
lookup per record, mostly the interpreter's work; then the five publish detectors' calls on every
publish (session 41), four of which test it and do nothing. _folds.c does exactly what the Python
does for a record of plain values into state of the usual shapes, or nothing: anything else (a new
incarnation or consumer scope, a record before the horizon, a delivery past a threshold, a publish
another kind counts, ...) goes the Python way, which stays the one statement of the rules.
tests/test_folds.py holds the two to the same state after every record, and the same rows and
findings, on the examples, the lab captures, the bench generator's traffic and hypothesis traffic.

`hand_off` is the pass's way to them: one C call per record of a connection's timeline does what
connection_analysis.py's Python does with it (out, the detectors, channel_metrics, the
checkpoint's kept records), each fold through its twin first and its Python method where the twin
declines, where the Python took four calls per record to get there. tests/test_folds.py analyses
each connection with it and without, and requires the same outputs and state after every row.
`peak_change` and `boundary_records` are twins of two list functions (a closing bucket's peak
level; the checkpoint's prune of the records it keeps), held to their Python the same way.

Built by `pip install` (setup.py; optional); ACKSCOPE_PURE_PYTHON=1 leaves it out.
"""

from __future__ import annotations

from . import pure_python
from .timeline import records as r

try:
    from . import _folds
except ImportError:  # not compiled
    _folds = None

# The constants _folds.c compares, by the names it knows them by.
STRINGS = {"unknown": r.UNKNOWN, "confirm": r.CONFIRM, "basic_deliver": "basic.deliver", "ack": r.ACK, "nack": r.NACK,
           "reject": r.REJECT, "recovered": r.RECOVERED, "channel_closed": r.CHANNEL_CLOSED,
           "connection_closed": r.CONNECTION_CLOSED, "open": r.OPEN, "acked": r.ACKED, "nacked": r.NACKED,
           "lost": r.LOST, "consumer_scope": "consumer ", "none": r.NONE}


def metrics_fold(metrics: type, incarnation: type, bucket: type, counts: tuple[str, ...]):
    """`fold(metrics, record) -> bool` (True: ChannelMetrics' fold of the record is done; False:
    nothing changed, the Python takes it), or None where the C module is not built or is off."""
    if _folds is None or pure_python():
        return None
    _folds.configure_metrics({"METRICS": metrics, "INCARNATION": incarnation, "BUCKET": bucket,
                              "DELIVERY": r.Delivery, "PUBLISH": r.Publish}, STRINGS, counts)
    return _folds.metrics_record


def peak_change():
    """`peak_change(arrivals, departures) -> int | None`, metrics._peak_change's value (None: an int
    it does not read, which the Python takes), or None where the C module is not built or is off."""
    if _folds is None or pure_python():
        return None
    return _folds.peak_change


def boundary_records():
    """`boundary_records(records, boundary_ns) -> list | None`, carry._boundary_records' list of the
    same records (None: a record or value it does not read, which the Python takes), or None where
    the C module is not built or is off."""
    if _folds is None or pure_python():
        return None
    _folds.configure_boundary({"DELIVERY": r.Delivery, "PUBLISH": r.Publish}, STRINGS)
    return _folds.boundary_records


def buildup_fold(unacked: type, buildup: type, profile: type):
    """`fold(unacked_buildup, delivery) -> bool` (True: UnackedBuildup.add is done; False: nothing
    changed, the Python takes it), or None where the C module is not built or is off."""
    if _folds is None or pure_python():
        return None
    _folds.configure_buildup({"UNACKED": unacked, "BUILDUP": buildup, "PROFILE": profile, "DELIVERY": r.Delivery},
                             STRINGS)
    return _folds.buildup_add


def publish_fold(synchronous: type, lockstep: type, firsts: type, max_evidence: int):
    """`fold(synchronous_confirms, publish) -> bool` (True: the publish detectors' fold of it is done,
    ConnectionDetectors.python_publish's work: it is one only synchronous_confirms counts; False:
    nothing changed, the Python takes it), or None where the C module is not built or is off."""
    if _folds is None or pure_python():
        return None
    _folds.configure_publish({"SYNCHRONOUS": synchronous, "LOCKSTEP": lockstep, "FIRSTS": firsts,
                              "PUBLISH": r.Publish}, STRINGS, max_evidence)
    return _folds.publish_add


def hand_off(analysis: type, whole: type, detectors: type):
    """`make(analysis, whole) -> hook`: the timeline's emit hook of a ConnectionAnalysis over its
    WholeConnection (connection_analysis.py; of exactly the classes given, `detectors` the
    ConnectionDetectors), which does in one C call what `whole._emit` does when `whole.out` is
    `analysis._record`; or None where the C module is not built or is off."""
    if _folds is None or pure_python():
        return None
    _folds.configure_hand_off({"ANALYSIS": analysis, "WHOLE": whole, "DETECTORS": detectors,
                               "DELIVERY": r.Delivery, "PUBLISH": r.Publish}, STRINGS)
    return _folds.HandOff
