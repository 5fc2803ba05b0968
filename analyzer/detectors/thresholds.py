"""The tunables of the detectors (analyzer/detectors, the findings across connections among them), with production defaults.

Only three finding kinds have no exact line in the protocol: how long a delivery may stay
unacked, how many bounces make a requeue loop, and how lockstep a publisher must be to be
"synchronous". Every other kind is a fact of the protocol (a lost confirm is lost) and has no
threshold. The defaults are for production traffic, where a capture spans minutes to days; the
traffic lab records seconds, so its tests pass lab-scale values (tests/findings_check.py).

On the command line: `--threshold name=value` (repeatable), parsed by `Thresholds.from_pairs`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Thresholds:
    # unacked_buildup: a manual-ack delivery unacked this long. RabbitMQ itself closes the channel
    # of a consumer that holds a delivery past `consumer_timeout` (30 minutes by default); five
    # minutes flags a stuck or overloaded consumer well before the broker steps in, and well
    # after any healthy handler has finished.
    unacked_age_seconds: float = 300.0
    # unacked_buildup: a consumer (or channel) holding its whole prefetch window, with no ack in
    # between, this long. At the limit the broker sends it nothing more, so its queue grows; a
    # minute there means the consumer stopped draining, even if no single delivery is five minutes old.
    prefetch_stall_seconds: float = 60.0
    # requeue_loop: deliveries of one message, each but the last bounced by basic.nack/basic.reject
    # back to a queue (requeued, or dead-lettered back). Ten matches the spirit of quorum queues'
    # delivery-limit (20 by default since RabbitMQ 4.0) while catching a loop before it reaches that.
    requeue_loop_deliveries: int = 10
    # requeue_loop: an x-death count this high on any delivery: a dead-letter cycle, even when the
    # capture shows only its last turns.
    dead_letter_loop_count: int = 10
    # synchronous_confirms: a channel counts once it made this many confirm-mode publishes whose
    # pending count is known; fewer say little about its habit.
    synchronous_min_publishes: int = 100
    # synchronous_confirms: share of those publishes sent with nothing else awaiting a confirm.
    # Any publisher does that now and then; a synchronous one does it (nearly) always.
    synchronous_min_share: float = 0.9
    # synchronous_confirms: median time from the previous confirm to the next publish, at most.
    # A publisher that waits for each confirm publishes again at once (sub-millisecond in the lab);
    # one that simply publishes rarely (every few seconds) is not held back by its confirms.
    synchronous_max_idle_seconds: float = 0.05

    def __post_init__(self) -> None:
        for name in ("unacked_age_seconds", "prefetch_stall_seconds", "synchronous_max_idle_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"threshold {name} must be > 0, not {getattr(self, name)!r}")
        for name in ("requeue_loop_deliveries", "dead_letter_loop_count"):
            if getattr(self, name) < 2:  # one delivery, or one dead-lettering, is no loop
                raise ValueError(f"threshold {name} must be >= 2, not {getattr(self, name)!r}")
        if self.synchronous_min_publishes < 1:
            raise ValueError(f"threshold synchronous_min_publishes must be >= 1, not {self.synchronous_min_publishes!r}")
        if not 0 < self.synchronous_min_share <= 1:
            raise ValueError(f"threshold synchronous_min_share must be in (0, 1], not {self.synchronous_min_share!r}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_pairs(cls, pairs: list[str] | tuple[str, ...], base: Thresholds | None = None) -> Thresholds:
        """`["unacked_age_seconds=120", ...]` (the CLI's `--threshold name=value`) over `base` (the defaults)."""
        base = base if base is not None else cls()
        types = {f.name: f.type for f in fields(cls)}
        changes: dict[str, float | int] = {}
        for pair in pairs:
            name, sep, text = pair.partition("=")
            name, text = name.strip(), text.strip()
            if not sep or not name:
                raise ValueError(f"--threshold {pair!r}: expected name=value, one of {', '.join(cls.names())}")
            if name not in types:
                raise ValueError(f"--threshold {pair!r}: unknown threshold {name!r}; valid: {', '.join(cls.names())}")
            convert = int if types[name] in (int, "int") else float
            try:
                changes[name] = convert(text)
            except ValueError:
                raise ValueError(f"--threshold {pair!r}: {name} needs {'an integer' if convert is int else 'a number'}, "
                                 f"not {text!r}") from None
        return replace(base, **changes)
