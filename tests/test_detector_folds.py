"""The detectors' bounded forms against oracles written here from their definitions:

- unacked_buildup's profile (analyzer/detectors/profile.py), folded in pieces at any horizon the
  caller may give, against the most unacked at once and the longest stall at the limit computed
  row by row over all the events at once;
- synchronous_confirms' median idle time (analyzer/detectors/quantiles.py) within its stated
  relative error of the exact lower median;
- every kind, folded at the state machine's horizon after every row, against the same detectors
  folded only at the end (a fold too early would take in an event before one still to come);
- the profile's fold in C (_profile.c) against its Python (`python_fold`): the same state after
  every fold, and where the C declines, nothing it was given changed (the Python then folds, or
  raises as it always did).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.detectors import ConnectionDetectors, wants_frame
from analyzer.detectors import profile as profile_module
from analyzer.detectors import quantiles
from analyzer.detectors.profile import Profile, _compacted
from analyzer.detectors.publisher import lower_median_index
from analyzer.timeline import INPUT_COLUMNS
from analyzer.timeline.connection import ConnectionTimeline
from analyzer.timeline.metrics_stream import item_horizons

from .conftest import check_built, needs_built
from .findings_check import LAB_THRESHOLDS as LAB
from .test_detectors_python import random_connections
from .test_folds import snapshot

FOLD_IN_C = profile_module._fold_in_c


def profile_oracle(events: list[tuple[int, int]], limit: int | None, end_ns: int | None):
    """(peak, stall) from the definition: rows in (key, time) order, tied keys counted together,
    each row lasting until the next (the last until the end), a run of rows at the limit timed
    from its first row."""
    rows = sorted(events)
    after, running = [], 0
    for key, _ in rows:
        running += 1 if key % 2 == 0 else -1
        after.append(running)
    unacked = []
    for i, (key, _) in enumerate(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1][0] == key:
            j += 1
        unacked.append(after[j])
    peak = max(unacked)
    if limit is None or limit <= 0:
        return peak, None
    stall = None
    for i in range(len(rows)):
        if unacked[i] < limit:
            continue
        first = i
        while first > 0 and unacked[first - 1] >= limit:
            first -= 1
        following = rows[i + 1][1] if i + 1 < len(rows) else end_ns if end_ns is not None else rows[-1][1]
        stall = max(stall, following - rows[first][1]) if stall is not None else following - rows[first][1]
    return peak, stall


@st.composite
def deliveries(draw):
    """(seq, ts, settle (seq, ts) or None, prefetch) of a scope's deliveries, seqs distinct;
    settlements at or after their delivery, some shared (a multiple ack), times not always rising."""
    n = draw(st.integers(1, 40))
    seqs = sorted(draw(st.sets(st.integers(1, 200), min_size=n, max_size=n)))
    out = []
    for seq in seqs:
        ts = seq * 10 + draw(st.integers(-15, 5))
        settle = None
        if draw(st.booleans()):
            settle_seq = seq + draw(st.sampled_from([0, 1, 2, 5, 30, 100]))
            settle = (settle_seq, settle_seq * 10 + draw(st.integers(-3, 3)))
        out.append((seq, ts, settle, draw(st.sampled_from([None, 0, 1, 2, 3, 5]))))
    return out


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(items=deliveries(), data=st.data())
def test_the_folded_profile_is_the_profile_of_all_events(items, data):
    profile = Profile()
    events, limit = folded_in_pieces(profile, items, data)
    profile.end_ns = data.draw(st.sampled_from([None, 5_000]))
    profile.fold(None)
    assert profile.result() == profile_oracle(events, limit, profile.end_ns)
    assert_bounded(profile)


def folded_in_pieces(profile, items, data) -> tuple[list, int | None]:
    """`items` (deliveries()) into `profile` (anything with Profile's `limit`, `add` and `fold`) in
    a drawn order, folded at drawn horizons none of which is past an event still to come: (the
    events, the limit)."""
    order = data.draw(st.permutations(items), label="emitted in")
    events, limit = [], None
    for at, (seq, ts, settle, prefetch) in enumerate(order):
        for_profile = [(seq * 2, ts)] + ([(settle[0] * 2 + 1, settle[1])] if settle else [])
        events += for_profile
        limit = prefetch if limit is None else max(limit, prefetch) if prefetch is not None else limit
        profile.limit = limit
        for key, time in for_profile:
            profile.add(key, time)
        if data.draw(st.booleans(), label="fold here"):
            unseen = [s for s, *_ in order[at + 1:]]
            horizon = 2 * min(unseen) if unseen else None
            if horizon is not None and data.draw(st.booleans(), label="lower"):
                horizon = data.draw(st.integers(0, horizon), label="horizon")
            profile.fold(horizon)
    return events, limit


def assert_bounded(profile: Profile) -> None:
    """What a fold keeps is bounded by the levels reached: disjoint ascending bands and a stack of
    rising levels, none above the peak."""
    edges = [edge for lo, hi, _ in profile.closed for edge in (lo, hi)]
    assert edges == sorted(edges) and all(lo < hi for lo, hi, _ in profile.closed)
    assert not edges or edges[-1] <= profile.peak
    levels = [level for level, _, _ in profile.stack]
    assert levels == sorted(set(levels)) and (not levels or levels[-1] <= profile.peak)


def test_long_runs_and_deep_multiple_acks_fold_exactly():
    """Hundreds of deliveries, acks of up to 400 at once, folded in large and small pieces under
    limits that rise between folds: runs span folds, and the range tables go many levels deep."""
    rng = random.Random(7)
    for _ in range(40):
        seqs = sorted(rng.sample(range(1, 3000), rng.randint(50, 400)))
        profile, events, limit = Profile(), [], None
        order = [(seq, seq * 10 + rng.randint(-40, 10)) for seq in seqs]
        if rng.random() < 0.5:
            rng.shuffle(order)
        for at, (seq, ts) in enumerate(order):
            events.append((seq * 2, ts))
            profile.add(seq * 2, ts)
            if rng.random() < 0.85:
                settle = seq + rng.choice([0, 1, 3, 10, 50, 400])
                events.append((settle * 2 + 1, settle * 10 + rng.randint(-5, 5)))
                profile.add(*events[-1])
            if rng.random() < 0.02:
                limit = max(limit or 0, rng.choice([0, 1, 5, 20, 60, 150]))
                profile.limit = limit
            if rng.random() < 0.05:
                unseen = [s for s, _ in order[at + 1:]]
                profile.fold(2 * min(unseen) if unseen else None)
        profile.fold(None)
        assert profile.result() == profile_oracle(events, limit, None)
        assert_bounded(profile)


@settings(max_examples=300, deadline=None)
@given(bands=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40), st.integers(-50, 10**12)), max_size=60),
       floor=st.integers(0, 20))
def test_compacted_bands_answer_every_limit_as_the_bands_did(bands, floor):
    """The closed runs' compaction: for every limit above the floor, the longest stall of the bands
    over it, in disjoint ascending bands with no two neighbours of equal stall."""
    lo, hi, stall = (np.array([band[i] for band in bands], np.int64) for i in range(3))
    compact = _compacted(lo, hi, stall, floor)
    for limit in range(floor + 1, 42):
        over = [value for a, b, value in bands if a < limit <= b]
        got = [value for a, b, value in compact if a < limit <= b]
        assert got == ([max(over)] if over else []), limit
    edges = [edge for a, b, _ in compact for edge in (a, b)]
    assert edges == sorted(edges) and all(a < b for a, b, _ in compact)
    assert all(not (x[1] == y[0] and x[2] == y[2]) for x, y in zip(compact, compact[1:]))


def test_times_too_far_apart_to_subtract_are_refused():
    profile = Profile()
    profile.limit = 1
    profile.add(2, -2 ** 62)
    profile.add(4, 2 ** 62)
    with pytest.raises(ValueError, match="too far apart"):
        profile.fold(None)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.integers(-10**6, 10**13), min_size=1, max_size=200))
def test_the_median_is_within_its_relative_error(values):
    histogram = {}
    for value in values:
        quantiles.add(histogram, value)
    exact = sorted(values)[lower_median_index(len(values))]
    answer = quantiles.ranked(histogram, lower_median_index(len(values)))
    assert math.isclose(answer, exact, rel_tol=quantiles.RELATIVE_ERROR * 1.0001, abs_tol=1)


def findings_folded(rows: list[dict], connection: dict, every_row: bool) -> list:
    detectors = ConnectionDetectors(connection, LAB)
    timeline = ConnectionTimeline(connection["connection_id"], "test", detectors.record)
    for row in rows:
        if wants_frame(row):
            detectors.frame(row)
        timeline.feed({name: row.get(name) for name in INPUT_COLUMNS})
        if every_row:
            detectors.fold(*item_horizons(timeline))
    timeline.end()
    detectors.context.connection = connection
    return detectors.raw_findings()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_folding_at_the_machines_horizon_after_every_row_changes_no_finding(data):
    frames, connections = random_connections(data, 3)
    for connection in connections:
        rows = [row for row in frames if row["connection_id"] == connection["connection_id"]]
        assert findings_folded(rows, connection, True) == findings_folded(rows, connection, False)


# -- the profile's fold in C -------------------------------------------------------------------------

class TwinProfiles:
    """Two profiles fed the same events: one folded by `python_fold`, one by the C twin, which must
    take every fold of plain values; their whole state compared after each fold."""

    def __init__(self):
        self.python, self.c = Profile(), Profile()

    def add(self, key: int, time: int) -> None:
        self.python.add(key, time)
        self.c.add(key, time)

    def set(self, name: str, value) -> None:
        setattr(self.python, name, value)
        setattr(self.c, name, value)

    @property
    def limit(self) -> int | None:
        return self.c.limit

    @limit.setter
    def limit(self, value: int | None) -> None:
        self.set("limit", value)

    def fold(self, horizon: int | None) -> None:
        self.python.python_fold(horizon)
        c = self.c
        if c.keys:
            folded = FOLD_IN_C(c.keys, c.times, horizon, c.floor(), c.running, c.peak, c.last_time, c.stack, c.closed)
            assert folded is not None, "the C twin declined a fold of plain values"
            c.keys, c.times, c.running, c.peak, c.last_time, c.stack, c.closed = folded
        assert snapshot(c) == snapshot(self.python)


needs_c = needs_built(FOLD_IN_C is not None, "analyzer.detectors._profile is not built")


@pytest.mark.c_twin
def test_the_profile_fold_is_built_in_ci():
    check_built(FOLD_IN_C is not None, "analyzer.detectors._profile is not built")


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(items=deliveries(), data=st.data())
def test_the_c_fold_is_the_python_fold(items, data):
    twins = TwinProfiles()
    events, limit = folded_in_pieces(twins, items, data)
    twins.fold(None)
    assert twins.c.result() == profile_oracle(events, limit, None)


@needs_c
def test_the_c_fold_of_long_runs_and_deep_multiple_acks_is_the_python_fold():
    """As test_long_runs_and_deep_multiple_acks_fold_exactly, both ways, compared after every fold:
    runs carried across folds, closed bands recompacted under a rising floor, long stacks."""
    rng = random.Random(11)
    taken_runs = 0
    for _ in range(40):
        seqs = sorted(rng.sample(range(1, 3000), rng.randint(50, 400)))
        twins, limit = TwinProfiles(), None
        order = [(seq, seq * 10 + rng.randint(-40, 10)) for seq in seqs]
        if rng.random() < 0.5:
            rng.shuffle(order)
        for at, (seq, ts) in enumerate(order):
            twins.add(seq * 2, ts)
            if rng.random() < 0.85:
                settle = seq + rng.choice([0, 1, 3, 10, 50, 400])
                twins.add(settle * 2 + 1, settle * 10 + rng.randint(-5, 5))
            if rng.random() < 0.02:
                limit = max(limit or 0, rng.choice([0, 1, 5, 20, 60, 150]))
                twins.set("limit", limit)
            if rng.random() < 0.05:
                unseen = [s for s, _ in order[at + 1:]]
                twins.fold(2 * min(unseen) if unseen else None)
                taken_runs += bool(twins.c.stack or twins.c.closed)
        twins.fold(None)
    assert taken_runs > 20   # the runs' part of the fold ran, not only the early way out


@needs_c
@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_c_fold_of_any_carried_state_is_the_python_fold(data):
    """States no single run of events reaches (a fold's levels rise one delivery at a time): open
    runs of any rising levels with gaps between them, any closed bands, then events that close some
    runs part way (a run carried at a level between two of them), folded at any horizon."""
    draw = data.draw
    levels = sorted(set(draw(st.lists(st.integers(1, 30), max_size=6), label="open levels")))
    stack = [[level, draw(st.integers(0, 1000)), draw(st.integers(0, 1000))] for level in levels]
    if stack and draw(st.booleans(), label="top has no following yet"):
        stack[-1][2] = None
    bands = draw(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 31), st.integers(-100, 2000)), max_size=8))
    twins = TwinProfiles()
    twins.set("limit", draw(st.sampled_from([None, 0, 1, 3, 8, 20]), label="limit"))
    twins.set("stack", stack)
    twins.set("closed", [[lo, hi, stall] for lo, hi, stall in bands if lo < hi])
    running = (levels[-1] if levels else 0) + draw(st.integers(0, 3))
    twins.set("running", running)
    twins.set("peak", running + draw(st.integers(0, 5)))
    twins.set("last_time", draw(st.integers(0, 1000)))
    for key, time in draw(st.lists(st.tuples(st.integers(0, 80), st.integers(-50, 1500)), min_size=1, max_size=40)):
        twins.add(key, time)
    twins.fold(draw(st.none() | st.integers(0, 90), label="horizon"))
    twins.fold(None)


# Fields a fold reads, each damaged so that the C twin must decline (the Python then decides).
DAMAGED = {
    "a key that is not an int": ("keys", [2, 4.0]),
    "a bool for an int": ("times", [10, True]),
    "a time past 2**62": ("times", [10, 2 ** 62]),
    "a stack entry of two": ("stack", [[1, 5]]),
    "a stack entry as a tuple": ("stack", [(1, 5, None)]),
    "a closed band with no stall": ("closed", [[0, 1, None]]),
    "times too far apart to subtract": ("times", [-2 ** 61, 2 ** 61]),
    "a run carried open that never lasted, then closed": ("stack", [[5, 0, None], [3, 1, None]]),
}


@needs_c
@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_the_c_fold_declines_what_is_not_plain_and_changes_nothing(damage):
    name, value = DAMAGED[damage]
    profile = Profile()
    profile.limit = 1
    for key, time in ((2, 10), (4, 20)):
        profile.add(key, time)
    profile.stack = [[1, 0, 5]]
    setattr(profile, name, value)
    given = (profile.keys, profile.times, None, profile.floor(), profile.running, profile.peak, profile.last_time,
             profile.stack, profile.closed)
    before = snapshot(list(given))
    assert FOLD_IN_C(*given) is None
    assert snapshot(list(given)) == before
