"""What each finding kind means and what to do about it: the README's findings table, shown in the
panels' descriptions (the (i) of a panel) so the dashboard answers "so what?" where it is read."""

from __future__ import annotations

FINDINGS = {
    "lost_confirm": (
        "critical", "the broker never took responsibility for these publishes (their channel or "
        "connection closed before the confirm): they may or may not be in a queue",
        "republish them (with a message_id, so consumers can de-duplicate); keep unconfirmed messages "
        "until their confirm and republish after reconnecting"),
    "unknown_delivery_tag": (
        "critical", "the client acked a tag that was not outstanding; the broker closed the channel "
        "(406) and requeued everything unacked on it",
        "ack each delivery once, on the channel it came on, never after the channel was reopened, and "
        "never for no_ack consumers"),
    "confirm_nack": (
        "warning", "the broker refused these publishes (queue limits with reject-publish, internal errors)",
        "republish or divert them; check queue length limits and overflow settings"),
    "unacked_buildup": (
        "warning", "a consumer holds deliveries without acking: other consumers cannot have them and "
        "the queue backs up",
        "find the slow or stuck handler; ack on every code path; a prefetch of 100-300 and more "
        "consumers help a slow one"),
    "requeue_loop": (
        "warning", "a message keeps coming back because a consumer nacks or rejects it with requeue "
        "(or it cycles through dead-lettering)",
        "reject poison messages with requeue=false to a dead-letter exchange; set a quorum queue "
        "delivery-limit"),
    "redelivery_after_close": (
        "warning", "deliveries unacked when a channel closed were delivered again: work may be done twice",
        "make processing idempotent; ack before closing channels; find why consumers close with work in hand"),
    "unbounded_prefetch": (
        "warning", "a manual-ack consumer without a prefetch limit: the broker pushes the whole queue at it",
        "set basic.qos (100-300 is usual) before basic.consume"),
    "flow_blocked": (
        "warning", "the broker stopped reading from publishers (memory or disk alarm) or paused a channel",
        "look at the broker's memory and disk alarms; consumers that keep up and quorum queues prevent it"),
    "out_of_order_confirm": (
        "info", "confirms arrived in another order than the publishes (normal with persistent and "
        "transient mixes)",
        "nothing, unless the publisher assumes order: match confirms by tag, not by position"),
    "unroutable_returned": (
        "info", "a mandatory publish matched no queue and came back",
        "check the exchange's bindings and routing keys, or add an alternate exchange"),
    "unconfirmed_persistent_publish": (
        "info", "persistent messages sent without confirms or transactions: the publisher cannot know "
        "whether they reached disk",
        "use publisher confirms where the messages matter"),
    "synchronous_confirms": (
        "info", "the publisher waits for each confirm before the next publish: a few hundred messages "
        "a second at best",
        "keep a window of outstanding confirms (or batch) and handle confirms asynchronously"),
}

EVIDENCE = ("The evidence (connections, channels, delivery tags, message ids, capture packets) is not "
            "in Prometheus: `ackscope findings --lake DIR --kind KIND` prints it.")


def findings_table() -> str:
    """A markdown table of every kind, for the findings panels' descriptions."""
    rows = [f"| `{kind}` | {severity} | {meaning} | {action} |"
            for kind, (severity, meaning, action) in FINDINGS.items()]
    return "\n".join(["| kind | severity | what it means | what to do |", "| --- | --- | --- | --- |", *rows])


def about(kind: str) -> str:
    severity, meaning, action = FINDINGS[kind]
    return f"`{kind}` ({severity}): {meaning}. What to do: {action}."
