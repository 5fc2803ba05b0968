"""Thresholds and `for` durations of the alerting rules (dashboards/rules.py), with production defaults.

Validated here, documented here, nowhere else: `python -m dashboards.rules --set name=value` writes
rules with other values, and the end-to-end test writes lab-scale ones (its captures last seconds).
The findings the analysis pushes are verdicts already (analyzer/detectors/thresholds.py decided them), so
their alerts compare with 0; these numbers are for the agent's live gauges and counters, and for
the health of ackscope itself. Durations are whole seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from analyzer.detectors.thresholds import Thresholds


@dataclass(frozen=True)
class AlertSettings:
    # The Prometheus job that scrapes the agents: AmqpAgentDown fires when it has no target up.
    agent_job: str = "ackscope-agent"
    # Where alerts point for their runbook section: RUNBOOK.md as your site serves it (your Git
    # host's page of dashboards/RUNBOOK.md, an internal wiki copy). The default is the file's path
    # in the project, which names the section but is not a link.
    runbook_url: str = "dashboards/RUNBOOK.md"

    # AmqpUnackedBuildup (live): manual-ack deliveries unacked at once by one application. Ten
    # consumers at the usual prefetch of 100 stay under it; a consumer with no limit or a stuck pool
    # does not. The analysis side is the unacked_buildup finding.
    unacked_deliveries: int = 1000
    unacked_buildup_for_seconds: int = 900
    # AmqpOldestUnackedTooOld: the same line as the unacked_buildup detector (5 minutes: well before
    # RabbitMQ's 30-minute consumer_timeout closes the channel).
    oldest_unacked_seconds: float = Thresholds().unacked_age_seconds
    oldest_unacked_for_seconds: int = 60
    # AmqpRequeueLoop (live): nacks/rejects with requeue per second, sustained. A handful of retries
    # is normal; a poison message bounced by a fast consumer makes hundreds a second.
    requeues_per_second: float = 1.0
    requeue_loop_for_seconds: int = 600
    # AmqpUnboundedPrefetch (live): a manual-ack consumer without basic.qos this long.
    unbounded_prefetch_for_seconds: int = 900
    # AmqpFlowBlocked (live): the broker holding publishers blocked (memory or disk alarm) this long.
    flow_blocked_for_seconds: int = 300
    # A live problem counter whose series Prometheus first sees already above 0 (a connection that
    # opened and lost between two scrapes) holds its alert this long. It also needs Prometheus to
    # have scraped that agent this long ago: a new Prometheus or target must not page for old counts.
    new_series_window_seconds: int = 3600
    # Counted facts (a lost confirm is lost): they alert at once.
    lost_confirms_for_seconds: int = 0
    broker_nacks_for_seconds: int = 0
    unknown_delivery_tags_for_seconds: int = 0
    redelivery_after_close_for_seconds: int = 0
    out_of_order_confirms_for_seconds: int = 0

    # The agent's health.
    agent_down_for_seconds: int = 300
    agent_kernel_drops_for_seconds: int = 0
    agent_flush_failing_for_seconds: int = 300
    # The scheduled analysis: stale when its last success is older than this (an hourly schedule
    # that missed one run is not yet stale; two missed runs are).
    analysis_stale_seconds: int = 7200
    analysis_stale_for_seconds: int = 600
    analysis_failing_for_seconds: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "agent_job":
                if not value or '"' in value or "\\" in value:
                    raise ValueError(f"setting agent_job must be a plain job name, not {value!r}")
            elif f.name == "runbook_url":
                if not value or any(c in value for c in ' "#{}'):
                    raise ValueError(f"setting runbook_url must be a URL or path without spaces, quotes, "
                                     f"braces or '#', not {value!r}")
            elif f.name.endswith("_for_seconds"):
                if not isinstance(value, int) or value < 0:
                    raise ValueError(f"setting {f.name} must be a whole number of seconds >= 0, not {value!r}")
            elif not value > 0:
                raise ValueError(f"setting {f.name} must be > 0, not {value!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_pairs(cls, pairs: list[str] | tuple[str, ...], base: AlertSettings | None = None) -> AlertSettings:
        """`["unacked_deliveries=500", ...]` (`--set name=value`) over `base` (the defaults)."""
        base = base if base is not None else cls()
        types = {f.name: type(getattr(base, f.name)) for f in fields(cls)}
        changes: dict = {}
        for pair in pairs:
            name, sep, text = (part.strip() for part in pair.partition("="))
            if not sep or name not in types:
                raise ValueError(f"--set {pair!r}: expected name=value, name one of {', '.join(cls.names())}")
            try:
                changes[name] = types[name](text)
            except ValueError:
                raise ValueError(f"--set {pair!r}: {name} needs a {types[name].__name__}, not {text!r}") from None
        return replace(base, **changes)
