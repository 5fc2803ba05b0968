"""Bounded metric labels, one rule for the agent and `ackscope push` (DESIGN.md, "Metrics, labels
and alerts"): a series is per vhost and application, never per connection, port, channel, tag or
message. Both values come from clients and are hostile: each label has a cap that folds whatever
exceeds it into "other" and counts the folding, and every value is cut to a length bound with a
marker (terminal.bounded), so neither 3,000 random names, 1,000 refused vhosts nor 100 KB names
can blow up Prometheus or the agent.
"""

from __future__ import annotations

from collections import Counter

from .terminal import bounded

OTHER = "other"
UNKNOWN = "unknown"
APPLICATION, VHOST = "application", "vhost"
DEFAULT_MAX_APPLICATIONS = 200
DEFAULT_MAX_VHOSTS = 100
# Longest label value kept whole: any real connection name or vhost fits; beyond, the value is cut
# and says how much was cut ("...[+99,880 chars]"), so a cut value never passes for a whole one.
MAX_LABEL_LENGTH = 120


def application(connection_name: str | None, client_product: str | None, client_host: str | None) -> str:
    """The client's connection_name; else its product and host ("pika@10.0.0.7"); else "unknown".
    A host alone would make a label per client address, so the product must be known to use it.
    Cut to MAX_LABEL_LENGTH."""
    if connection_name:
        return bounded(connection_name, MAX_LABEL_LENGTH)
    if client_product:
        return bounded(f"{client_product}@{client_host}" if client_host else client_product, MAX_LABEL_LENGTH)
    return UNKNOWN


def vhost(name: str | None) -> str:
    return bounded(name, MAX_LABEL_LENGTH) if name else UNKNOWN


def was_cut(value: str) -> bool:
    """Did application() or vhost() cut this value? Only a cut value is longer than the bound."""
    return len(value) > MAX_LABEL_LENGTH


class LabelCap:
    """Admits at most `limit` distinct values of one label (first come, first kept) and folds the
    rest into "other", counting the folds, so a fleet of randomly named clients cannot blow
    up Prometheus. The admitted set lives as long as the object: the agent keeps one per label for
    its life, a push builds them per push (sorted input: the same lake gives the same labels).

    `admit=False` asks for a label without taking a slot: what a connection the broker has not
    accepted (connection.open without open-ok) gets, so refused clients cannot fill the cap."""

    def __init__(self, name: str, limit: int):
        if limit < 1:
            raise ValueError(f"the {name} cap must be at least 1, not {limit}")
        self.name, self.limit = name, limit
        self.admitted: set[str] = set()
        self.folds = 0       # values asked for and answered "other"
        self.truncated = 0   # admitted values that were cut to MAX_LABEL_LENGTH

    def label(self, value: str, admit: bool = True) -> str:
        if value in self.admitted:
            return value
        if admit and len(self.admitted) < self.limit:
            self.admitted.add(value)
            self.truncated += was_cut(value)
            return value
        self.folds += 1
        return OTHER


class SeriesCaps:
    """The caps of both labels a series of traffic carries: (vhost, application) in, the pair a
    series is exposed with out, each series folded by either cap counted once per metric."""

    def __init__(self, max_applications: int = DEFAULT_MAX_APPLICATIONS, max_vhosts: int = DEFAULT_MAX_VHOSTS):
        self.vhost = LabelCap(VHOST, max_vhosts)
        self.application = LabelCap(APPLICATION, max_applications)
        self.folded: Counter = Counter()  # metric name -> series folded into "other"

    def where(self, where: tuple[str, str], metric: str = "", admit: bool = True) -> tuple[str, str]:
        capped = self.vhost.label(where[0], admit), self.application.label(where[1], admit)
        if capped != where:
            self.folded[metric] += 1
        return capped

    def folds_by_label(self) -> dict[str, int]:
        return {cap.name: cap.folds for cap in (self.vhost, self.application)}

    def truncations_by_label(self) -> dict[str, int]:
        return {cap.name: cap.truncated for cap in (self.vhost, self.application)}
