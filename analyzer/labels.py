"""Bounded metric labels, one rule for the agent and `ackscope push` (DESIGN.md, "Metrics, labels
and alerts"): a series is per vhost and application, never per connection, port, channel, tag or
message, and a cap folds whatever exceeds it into application="other" and counts the folding.
"""

from __future__ import annotations

from collections import Counter

OTHER = "other"
UNKNOWN = "unknown"
DEFAULT_MAX_APPLICATIONS = 200


def application(connection_name: str | None, client_product: str | None, client_host: str | None) -> str:
    """The client's connection_name; else its product and host ("pika@10.0.0.7"); else "unknown".
    A host alone would make a label per client address, so the product must be known to use it."""
    if connection_name:
        return connection_name
    if client_product:
        return f"{client_product}@{client_host}" if client_host else client_product
    return UNKNOWN


def vhost(name: str | None) -> str:
    return name if name else UNKNOWN


class ApplicationCap:
    """Admits at most `limit` distinct application labels (first come, first kept) and folds the rest
    into "other", counting each fold per metric, so a fleet of randomly named clients cannot blow up
    Prometheus. The admitted set lives as long as the object: the agent keeps one for its life, a
    push builds one per push (sorted input: the same lake gives the same labels)."""

    def __init__(self, limit: int = DEFAULT_MAX_APPLICATIONS):
        if limit < 1:
            raise ValueError(f"the application cap must be at least 1, not {limit}")
        self.limit = limit
        self.admitted: set[str] = set()
        self.folded: Counter = Counter()  # metric name -> series folded into "other"

    def label(self, app: str, metric: str = "") -> str:
        if app in self.admitted:
            return app
        if len(self.admitted) < self.limit:
            self.admitted.add(app)
            return app
        self.folded[metric] += 1
        return OTHER
