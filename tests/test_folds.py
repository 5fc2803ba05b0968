"""The per-record folds in C (analyzer/folds.py, _folds.c) against their Python: channel_metrics'
`_delivery`/`_publish`, unacked_buildup's `add` and the publish detectors' (ConnectionDetectors.
python_publish), fed the same records: the same state after
every record, the same rows and findings at the end, and where the C twin declines a record, no
change at all (the Python then takes it, or raises as it always did). And the hand-off that puts
them in the pass's way (folds.hand_off): one connection analysed with it and without, the same
outputs and state after every row."""

import dataclasses
import os
import sys
from collections import Counter, deque

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

import analyzer.detectors as detectors
from analyzer import connection_analysis, folds
from analyzer.connection_analysis import ANALYSIS_COLUMNS, CarriedAnalysis, ConnectionAnalysis, Settings
from analyzer.detectors import ConnectionDetectors, consumer
from analyzer.detectors.consumer import UnackedBuildup
from analyzer.detectors.context import Context
from analyzer.ingest import decode
from analyzer.timeline import INPUT_COLUMNS, Timelines, metrics
from analyzer.timeline import records as r
from analyzer.timeline.metrics import ChannelMetrics
from analyzer.timeline import carry
from analyzer.timeline.carry import dump
from analyzer.timeline.metrics_stream import announce_opens, horizons
from analyzer.detectors.thresholds import Thresholds

from .conftest import CORPUS, ROOT, check_built, needs_built
from .test_corpus import POSITIVE
from .test_plain import capture_rows
from .test_timeline import EXAMPLES, SETTINGS, T0, renumbered, valid_traffic
from .variants import VARIANTS

METRICS_IN_C, BUILDUP_IN_C, PUBLISH_IN_C = metrics._fold_in_c, consumer._add_in_c, detectors._publish_in_c
HAND_OFF, BOUNDARY_IN_C = connection_analysis._hand_off, carry._boundary_in_c
BUILT = (METRICS_IN_C is not None and BUILDUP_IN_C is not None and PUBLISH_IN_C is not None and HAND_OFF is not None
         and BOUNDARY_IN_C is not None)
_folds = folds._folds
pytestmark = needs_built(BUILT, "analyzer._folds is not built")
# Lab-scale thresholds as well as production ones: deliveries past them take the Python's Tally path.
THRESHOLDS = (Thresholds(), Thresholds(unacked_age_seconds=0.004, prefetch_stall_seconds=0.002))


def snapshot(value):
    """Everything a fold can change, types included (True == 1 in Python, not here), dicts in order."""
    if isinstance(value, (list, tuple, deque)):
        return type(value).__name__, [snapshot(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return "set", sorted(map(repr, value))
    if isinstance(value, dict):
        return "dict", [(snapshot(k), snapshot(v)) for k, v in value.items()]
    slots = [name for cls in type(value).__mro__ for name in cls.__dict__.get("__slots__", ())]
    if slots and not isinstance(value, (str, int)):
        return type(value).__name__, [(name, snapshot(getattr(value, name, "<unset>"))) for name in slots]
    if hasattr(value, "__dict__") and not isinstance(value, type):   # the detectors' plain objects
        return type(value).__name__, snapshot(vars(value))
    return type(value).__name__, value


class Twins:
    """Two copies of one fold fed the same records: one the Python way only, one through the C twin
    first. `every_record`: compare their whole state after each record (small data)."""

    def __init__(self, python, c, in_c, python_way: str, every_record: bool):
        self.python, self.c, self.in_c, self.python_way = python, c, in_c, python_way
        self.every_record = every_record
        self.taken = Counter()

    def feed(self, x) -> None:
        before = snapshot(self.c) if self.every_record else None
        try:
            getattr(self.python, self.python_way)(x)
        except Exception as error:   # HorizonError, or a damaged record the Python cannot read
            assert not self.in_c(self.c, x), f"the C twin took {x} that the Python refused ({error!r})"
            assert snapshot(self.c) == before or not self.every_record
            with pytest.raises(type(error)):
                getattr(self.c, self.python_way)(x)
            self.taken["raised"] += 1
        else:
            taken = self.in_c(self.c, x)
            self.taken[(type(x).__name__, taken)] += 1
            if not taken:
                if self.every_record:
                    assert snapshot(self.c) == before, f"the C twin declined {x} but changed the state"
                getattr(self.c, self.python_way)(x)
        if self.every_record:
            assert snapshot(self.c) == snapshot(self.python), f"state differs after {x}"

    def both(self, method: str, *args):
        """The same call on both: the same answer (or the same error) and the same state after it."""
        try:
            want = getattr(self.python, method)(*args)
        except Exception as error:
            with pytest.raises(type(error)):
                getattr(self.c, method)(*args)
            return None
        assert getattr(self.c, method)(*args) == want
        assert snapshot(self.c) == snapshot(self.python)
        return want

    def taken_share(self) -> float:
        done = {key: n for key, n in self.taken.items() if key != "raised"}
        return sum(n for (_, taken), n in done.items() if taken) / max(1, sum(done.values()))


def metrics_twins(every_record: bool, bucket_seconds: int = 1) -> Twins:
    return Twins(ChannelMetrics(bucket_seconds), ChannelMetrics(bucket_seconds), METRICS_IN_C, "python_record",
                 every_record)


def buildup_twins(thresholds: Thresholds, every_record: bool) -> Twins:
    return Twins(UnackedBuildup(thresholds), UnackedBuildup(thresholds), BUILDUP_IN_C, "python_add", every_record)


def publish_twins(connection_id: str, thresholds: Thresholds, every_record: bool) -> Twins:
    def in_c(d, p):
        return PUBLISH_IN_C(d.synchronous, p)

    return Twins(ConnectionDetectors({"connection_id": connection_id}, thresholds),
                 ConnectionDetectors({"connection_id": connection_id}, thresholds), in_c, "python_publish", every_record)


def streamed(rows: list[dict], every_record: bool, advance_every: int = 7) -> list[Twins]:
    """Each connection's rows through the machine, its records into channel_metrics twins
    (advanced at the machine's horizons as the pass does), unacked_buildup twins and publish
    detectors' twins (folded at its item horizons, both thresholds); every twin's end compared."""
    out = []
    by_connection: dict[str, list[dict]] = {}
    for row in rows:
        by_connection.setdefault(row["connection_id"], []).append(row)
    for connection_id, own in by_connection.items():
        timelines = Timelines()
        m = metrics_twins(every_record)
        buildups = [buildup_twins(t, every_record) for t in THRESHOLDS]
        publishes = [publish_twins(connection_id, t, every_record) for t in THRESHOLDS]

        def fed(records):
            for x in records:
                m.feed(x)
                for twin in buildups if type(x) is r.Delivery else publishes if type(x) is r.Publish else ():
                    twin.feed(x)

        for count, row in enumerate(own, start=1):
            fed(timelines.feed(row))
            if count % advance_every == 0:
                timeline = timelines.connections[connection_id]
                for side in (m.python, m.c):
                    announce_opens(side, timeline)
                m.both("advance", *horizons(timeline))
                for b in buildups:
                    b.both("fold", timeline.last_seq)
                for p in publishes:
                    p.both("fold", None, timeline.last_seq)
        fed(timelines.end_of_data())
        m.both("finish")
        for b, thresholds in zip(buildups, THRESHOLDS):
            b.both("fold", None)
            assert b.c.findings(Context({"connection_id": connection_id}, thresholds)) == \
                b.python.findings(Context({"connection_id": connection_id}, thresholds))
        for p in publishes:
            p.both("raw_findings")
        out += [m, *buildups, *publishes]
    return out


def test_built_in_ci():
    check_built(BUILT, "analyzer._folds is not built")


@SETTINGS
@given(st.data())
def test_a_buckets_peak_in_c_is_the_pythons(data):
    """_folds.peak_change against metrics._peak_change on one level of a bucket as ChannelMetrics
    keeps it: arrivals as outstanding items, sorted (as `_close` sorts them), departures as instants
    in the order they came; a tight clock makes ties of ts. An int it does not read (negative, or
    wider than the encodings) gives None, and the Python takes the bucket."""
    ts = st.integers(0, 40) if data.draw(st.booleans(), label="tight clock") else st.integers(0, 2**63 - 1)
    seq = st.integers(0, 2**40)
    arrivals = sorted((((t * metrics._TS_SCALE + q * 2 + 3) << metrics._SETTLE_BITS) + settle + metrics._SETTLE_OFFSET)
                      for t, q, settle in data.draw(st.lists(st.tuples(ts, seq, st.integers(-2**63, metrics.NEVER)),
                                                             max_size=30), label="arrivals"))
    departures = [t * metrics._TS_SCALE + (0 if q is None else q * 2 + 2)
                  for t, q in data.draw(st.lists(st.tuples(ts, st.none() | seq), max_size=30), label="departures")]
    assert _folds.peak_change(arrivals, departures) == metrics._peak_change(arrivals, departures)
    if arrivals and departures:
        for unread in (-1, 1 << 200):
            assert _folds.peak_change([*arrivals, unread], departures) is None
            assert _folds.peak_change(arrivals, [unread, *departures]) is None


def kept_record(data, ts) -> object:
    """A record as a prune meets it in WholeConnection.kept: a delivery or publish whose times,
    seq, method and incarnation vary where _boundary_records reads them, or another record."""
    kind = data.draw(st.sampled_from([r.Delivery, r.Delivery, r.Publish, r.ChannelFacts]), label="kind")
    fields = {f.name: None for f in dataclasses.fields(kind)}
    if kind is r.ChannelFacts:
        return kind(**fields)
    fields.update(ts_ns=data.draw(ts, label="ts"), seq=data.draw(st.integers(0, 40), label="seq"),
                  settle_ts_ns=data.draw(st.none() | ts, label="settle"),
                  channel=data.draw(st.integers(1, 3), label="channel"),
                  incarnation=data.draw(st.integers(0, 2), label="incarnation"),
                  outcome=data.draw(st.sampled_from([r.UNKNOWN, r.OPEN, r.ACK, r.ACKED, r.UNTRACKED]), label="outcome"))
    if kind is r.Delivery:
        fields["method"] = data.draw(st.sampled_from(["basic.deliver", "basic.get-ok"]), label="method")
        fields["no_ack"] = data.draw(st.sampled_from([False, True, None]), label="no_ack")
    else:
        fields["mode"] = data.draw(st.sampled_from(list(r.PUBLISH_MODES)), label="mode")
    return kind(**fields)


@SETTINGS
@given(st.data())
def test_the_checkpoints_boundary_records_in_c_are_the_pythons(data):
    """_folds.boundary_records against carry.python_boundary_records on the kept records of a
    prune: the same records, in the same order (a tight clock makes ties of ts and seq, where the
    first of equals stays). Whatever it does not read (a time that is not an int of 64 bits, a
    subclass) gives None, and the Python takes the list."""
    ts = st.integers(0, 12) if data.draw(st.booleans(), label="tight clock") else st.integers(-2**63, 2**63 - 1)
    records = data.draw(st.lists(st.builds(lambda: kept_record(data, ts)), max_size=40), label="records")
    boundary = data.draw(ts, label="boundary")
    kept = BOUNDARY_IN_C(records, boundary)
    assert kept is not None
    python = carry.python_boundary_records(records, boundary)
    assert [id(x) for x in kept] == [id(x) for x in python]
    items = [x for x in records if type(x) is not r.ChannelFacts]
    if items:
        odd = dataclasses.replace(items[-1], ts_ns=data.draw(st.sampled_from([None, 1 << 64, 1.5]), label="odd"))
        assert BOUNDARY_IN_C([*records, odd], boundary) is None
        # An outcome (or mode) it does not read, where the rule reads it: an item never settled, before the boundary.
        unread = {"outcome": None} if data.draw(st.booleans(), label="odd outcome") or type(odd) is r.Delivery \
            else {"mode": None}
        odd = dataclasses.replace(items[-1], ts_ns=boundary - 1, settle_ts_ns=None, **unread)
        if boundary - 1 >= -2**63:
            assert BOUNDARY_IN_C([*records, odd], boundary) is None
    assert BOUNDARY_IN_C(records, 1 << 64) is None and BOUNDARY_IN_C(tuple(records), boundary) is None

    class Subclass(r.Delivery):
        __slots__ = ()
    subclassed = object.__new__(Subclass)   # (the records' __init__ would make it a Delivery)
    for f in dataclasses.fields(r.Delivery):
        object.__setattr__(subclassed, f.name, 0)
    assert BOUNDARY_IN_C([subclassed], boundary) is None


def traffic_or_damaged_variant(data) -> list[dict]:
    """Hypothesis traffic's frame rows, as they are or damaged by one of tests/variants.py's variants.
    The generator's own notes (`_confirm_number`) are no frame column: the rows go without them, as
    the pass's rows would (a checkpoint refuses an unknown column)."""
    rows = [{k: v for k, v in row.items() if not k.startswith("_")} for row in valid_traffic(data).conv.rows]
    variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    return rows if VARIANTS[variant] is None else VARIANTS[variant](data, rows)


@SETTINGS
@given(st.data())
def test_random_traffic_and_its_damaged_variants(data):
    streamed(renumbered(traffic_or_damaged_variant(data)), every_record=True, advance_every=data.draw(st.integers(1, 12), label="advance"))


@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_the_lab_examples(capture):
    twins = streamed(capture_rows(capture), every_record=False)
    assert any(t.taken for t in twins), "no records: nothing compared"


@pytest.mark.parametrize("name", POSITIVE)
def test_the_public_corpus(name):
    streamed(capture_rows(os.path.join(CORPUS, name)), every_record=False)


def test_busy_generated_traffic_goes_through_c():
    """The bench generator's traffic: equal, and nearly every record taken by the C twins."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import pass_cpu
    from frames_generator import Params
    table, _ = pass_cpu.pass_input(Params(frames=30_000, hot_deliveries=8_000))
    rows = [row for row in table.select(INPUT_COLUMNS).to_pylist() if row["seq"] != pass_cpu.HEADER_SEQ]
    twins = streamed(rows, every_record=False, advance_every=4096)
    by_kind = Counter()
    for t in twins:
        by_kind[t.python_way] += sum(n for key, n in t.taken.items() if key != "raised")
    assert by_kind["python_record"] > 20_000 and by_kind["python_add"] > 10_000, by_kind
    assert by_kind["python_publish"] > 5_000, by_kind
    metrics_share = min(t.taken_share() for t in twins if t.python_way == "python_record" and t.taken)
    production = [t for t in twins if t.python_way == "python_add" and t.python.thresholds == THRESHOLDS[0]]
    assert metrics_share > 0.9 and min(t.taken_share() for t in production if t.taken) > 0.9
    publish_taken = sum(n for t in twins if t.python_way == "python_publish"
                        for (_, taken), n in t.taken.items() if taken)
    assert publish_taken / by_kind["python_publish"] > 0.9, publish_taken / by_kind["python_publish"]


class Text(str):
    """A str the C twins must not take for one (its == could be anything)."""


# Values a damaged or forged record could hold, for each field the folds read.
ODD = {
    "ts_ns": [-1, 0, 2**62, 2**64, None, True, 1.5],
    "seq": [-5, 0, 2**62 - 1, 2**62, None, False],
    "settle_ts_ns": [None, -1, 0, 2**63, True],
    "settle_seq": [None, -1, 2**62, 1.0],
    "outcome": [Text("ack"), r.ACK, r.NACK, r.REJECT, r.OPEN, r.UNKNOWN, r.AUTO, r.RECOVERED, r.ACKED, r.NACKED, r.LOST,
                "weird", None],
    "method": [Text("basic.deliver"), "basic.get-ok", None],
    "no_ack": [None, True, False, 0],
    "redelivered": [None, True, 1, "yes"],
    "requeue": [None, True, 0],
    "mode": [r.CONFIRM, Text("confirm"), r.TX, r.NONE, r.UNKNOWN, None, 1.5],
    "return_seq": [None, 5],
    "connection_id": [Text("c"), None, 7],
    "channel": [True, 1.0, 2**70],
    "incarnation": [None, 2],
    "agent_id": [None, "a", Text("a"), 3],
    "consumer_prefetch": [None, 0, 5, -1, 2**64, "5"],
    "channel_prefetch": [None, 0, 3, 2.5],
    "consumer_tag": [None, "", Text("ct"), 9],
    "observed_until_ts_ns": [None, 2**63, -3],
    "pending_before": [None, 0, 1, -1, True, False, 2**64, 0.0],
    "persistent": [None, True, False, 1],
    "out_of_order": [None, True, False, 1],
    "confirm_multiple": [None, True, False, 0],
    "confirm_seq": [None, 3, "x"],
    "message_identity": [None, "m", Text("m"), 5],
}


@SETTINGS
@given(st.data())
def test_damaged_records_are_taken_exactly_or_left_to_python(data):
    """Real records with fields replaced by odd values, fed between plain ones: the C twins take a
    record only when they do exactly what the Python does, and never one the Python refuses."""
    rows = renumbered(valid_traffic(data).conv.rows)
    timelines = Timelines()
    records = [x for row in rows for x in timelines.feed(row)] + timelines.end_of_data()
    # Buckets of ~32 years: a time far from the others (2**64, -1) must not make billions of quiet
    # buckets between them, which the Python would list as rows (for both twins alike).
    m = metrics_twins(every_record=True, bucket_seconds=10**9)
    buildups = [buildup_twins(t, every_record=True) for t in THRESHOLDS]
    publishes = [publish_twins("c", t, every_record=True) for t in THRESHOLDS]
    for x in records:
        if type(x) not in (r.Delivery, r.Publish):
            m.feed(x)
            continue
        if data.draw(st.booleans(), label="damage"):
            names = [name for name in ODD if hasattr(x, name)]
            changes = data.draw(st.dictionaries(st.sampled_from(names), st.none(), min_size=1, max_size=3), label="fields")
            x = dataclasses.replace(x, **{name: data.draw(st.sampled_from(ODD[name]), label=name) for name in changes})
        m.feed(x)
        for twin in buildups if type(x) is r.Delivery else publishes:
            twin.feed(x)
        if data.draw(st.integers(0, 9), label="advance") == 0:
            m.both("advance", data.draw(st.sampled_from([None, x.ts_ns, 2**61]), label="horizon"))
    m.both("finish")
    for p in publishes:
        p.both("fold", None, None)
        p.both("raw_findings")


# -- the hand-off: each record of a ConnectionAnalysis's timeline in one C call (folds.hand_off) ------

HAND_OFF_BUCKET_SECONDS = 1


def analysis_twins(connection_id: str, agent_id, thresholds: Thresholds, advance_every: int) -> tuple:
    """Two analyses of one connection: the first hands its records on the Python way
    (WholeConnection._emit, then ConnectionAnalysis._record), the second through the C hand-off.
    Each with its own outputs: (analysis, records, metric rows, open records)."""
    settings = Settings(HAND_OFF_BUCKET_SECONDS, r.DEFAULT_OVERDUE_NS, thresholds)
    twins = []
    for python_way in (True, False):
        out = ([], [], [])
        analysis = ConnectionAnalysis(connection_id, agent_id, settings, out[0].append, out[1].extend,
                                      advance_every, out[2].append)
        if python_way:
            analysis.whole.timeline.emit = analysis.whole._emit
        else:
            assert type(analysis.whole.timeline.emit) is _folds.HandOff
        twins.append((analysis, *out))
    return tuple(twins)


def assert_same_analyses(python: tuple, c: tuple) -> None:
    """Everything the hand-off reaches: the records out, the checkpoint's kept records, the
    detectors' and channel_metrics' whole state and what they let out."""
    (a, *a_out), (b, *b_out) = python, c
    assert b_out == a_out
    assert b.whole.kept == a.whole.kept
    assert snapshot(b.detectors) == snapshot(a.detectors)
    assert snapshot(b.metrics) == snapshot(a.metrics) and b.metrics_redo == a.metrics_redo


def analysed_both_ways(rows: list[dict], thresholds: Thresholds, advance_every: int, every_row: bool) -> list:
    """Each connection's rows (ANALYSIS_COLUMNS) through both analyses, fed as the pass feeds them
    (`feed_from`), or row by row with their states compared after each; then finished and compared.
    The analyses' answers at the end, the Python way's."""
    by_connection: dict[str, list[dict]] = {}
    for row in rows:
        by_connection.setdefault(row["connection_id"], []).append({**dict.fromkeys(ANALYSIS_COLUMNS), **row})
    done = []
    for connection_id, own in by_connection.items():
        python, c = analysis_twins(connection_id, own[0]["agent_id"], thresholds, advance_every)
        for analysis, *_ in (python, c):
            at = 0
            while at < len(own) and not every_row:
                at = analysis.feed_from(own, at, len(own))
        for row in own if every_row else ():
            python[0].feed(row)
            c[0].feed(row)
            assert_same_analyses(python, c)
        ends = [analysis.finish({"connection_id": connection_id}) for analysis, *_ in (python, c)]
        assert_same_analyses(python, c)
        assert ends[1].raw_findings == ends[0].raw_findings
        assert (ends[1].no_checkpoint, ends[1].metrics_redo) == (ends[0].no_checkpoint, ends[0].metrics_redo)
        assert [None if x.checkpoint is None else dump(x.checkpoint) for x in ends[1:]] == \
            [None if ends[0].checkpoint is None else dump(ends[0].checkpoint)]
        done.append(ends[0])
    return done


def clock_stepped_back(data, rows: list[dict]) -> list[dict]:
    """Rows spread over several metric buckets, their clock stepped back at one of them (merged
    captures): channel_metrics may have let out buckets the later records fall in (HorizonError)."""
    rows = [dict(row, ts_ns=T0 + i * 300_000_000) for i, row in enumerate(rows)]
    cut = data.draw(st.integers(0, len(rows)), label="step back at")
    back = data.draw(st.sampled_from([0, 3 * 10**9]), label="step back by")
    return [dict(row, ts_ns=row["ts_ns"] - back) if i >= cut else row for i, row in enumerate(rows)]


@SETTINGS
@given(st.data())
def test_the_hand_off_is_the_python_hand_off_on_random_traffic(data):
    rows = clock_stepped_back(data, renumbered(traffic_or_damaged_variant(data)))
    analysed_both_ways(rows, data.draw(st.sampled_from(THRESHOLDS), label="thresholds"),
                       data.draw(st.integers(1, 12), label="advance"), every_row=True)


def test_the_hand_off_gives_metrics_up_as_the_python_does():
    """The lab captures' busiest connection with its clock stepped back halfway: channel_metrics
    given up for it (metrics_redo) on both ways, at the same record."""
    by_connection: dict[str, list[dict]] = {}
    for capture in EXAMPLES:
        for row in analysis_rows(capture):
            by_connection.setdefault(row["connection_id"], []).append(row)
    rows = max(by_connection.values(), key=len)
    half = len(rows) // 2
    rows = [dict(row, ts_ns=row["ts_ns"] - 30 * 10**9) if i >= half else row for i, row in enumerate(rows)]
    done = analysed_both_ways(rows, THRESHOLDS[1], advance_every=1, every_row=False)
    assert len(done) == 1 and done[0].metrics_redo is not None


@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_the_hand_off_on_the_lab_examples(capture):
    for thresholds in THRESHOLDS:
        analysed_both_ways(analysis_rows(capture), thresholds, advance_every=7, every_row=False)


def test_the_hand_off_on_busy_generated_traffic():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import pass_cpu
    from frames_generator import Params
    table, _ = pass_cpu.pass_input(Params(frames=30_000, hot_deliveries=8_000))
    rows = [row for row in table.select(ANALYSIS_COLUMNS).to_pylist() if row["seq"] != pass_cpu.HEADER_SEQ]
    analysed_both_ways(rows, THRESHOLDS[0], advance_every=4096, every_row=False)


def test_the_hand_off_is_taken_where_records_are_handed_on_as_the_python_does():
    """A carried analysis (CarriedAnalysis over a ResumedConnection) keeps `_record` and `_emit`,
    so its records go through the C hand-off too (its checks read them where they are kept); a
    subclass handing records on otherwise keeps its own way."""
    settings = Settings(HAND_OFF_BUCKET_SECONDS, r.DEFAULT_OVERDUE_NS, THRESHOLDS[0])
    carried = CarriedAnalysis(None, "c", None, settings, [].append, [].extend)
    assert type(carried.whole.timeline.emit) is _folds.HandOff

    class Counting(ConnectionAnalysis):
        def _record(self, record) -> None:
            super()._record(record)

    class Resumed(carry.ResumedConnection):
        def _emit(self, record) -> None:
            super()._emit(record)

    class CarriedOtherwise(CarriedAnalysis):
        def _machine(self, connection_id, agent_id, settings):
            return Resumed(None, connection_id, agent_id, self._record, settings.bucket_ns)

    for otherwise in (Counting("c", None, settings, [].append, [].extend),
                      CarriedOtherwise(None, "c", None, settings, [].append, [].extend)):
        assert type(otherwise.whole.timeline.emit) is not _folds.HandOff


def analysis_rows(path: str) -> list[dict]:
    parts = []
    decode(path, parts.append)
    frames = pa.concat_tables(parts).select(ANALYSIS_COLUMNS)
    return frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist()
