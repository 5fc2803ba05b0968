"""A median over a stream in bounded memory: a log-bucketed histogram of integers.

An exact median needs every value kept (no one-pass exact form in less); synchronous_confirms
reads the median idle time of up to millions of publishes per channel, and its state goes into
every checkpoint. So the values are counted in buckets of geometrically growing width,
(GAMMA**(b-1), GAMMA**b] for positive values (mirrored for negative ones, zero on its own), and a
quantile is answered with its bucket's middle (2 GAMMA**b / (GAMMA + 1)): within RELATIVE_ERROR of
the exact value of that rank, whatever the values. A histogram has one entry per bucket in use: at
most ~1,400 for values of 1 ns to 1,000 s, a few dozen for one publisher's idle times. Full and
incremental runs build the same histogram from the same values, so they agree exactly.
"""

from __future__ import annotations

import math

RELATIVE_ERROR = 0.01
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)


def bucket(value: int) -> int:
    """The histogram key of `value`; keys sort as the values do."""
    if value == 0:
        return 0
    b = max(0, math.ceil(math.log(abs(value)) / _LOG_GAMMA)) + 1
    return b if value > 0 else -b


def middle(key: int) -> float:
    """The value a bucket answers for (within RELATIVE_ERROR of each value in it)."""
    if key == 0:
        return 0.0
    value = 2 * GAMMA ** (abs(key) - 1) / (GAMMA + 1)
    return value if key > 0 else -value


def add(histogram: dict[int, int], value: int) -> None:
    key = bucket(value)
    histogram[key] = histogram.get(key, 0) + 1


def ranked(histogram: dict[int, int], rank: int) -> float | None:
    """The value of 0-based `rank` among the counted values, as its bucket's middle; None if none."""
    seen = 0
    for key in sorted(histogram):
        seen += histogram[key]
        if rank < seen:
            return middle(key)
    return None
