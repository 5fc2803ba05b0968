"""What each finding kind means and what to do about it: one source for the README's table
("Findings, and what to do") and the HTML report. tests/test_report.py checks that the README
table says exactly this, and that its severities are the detectors'. Text in `backticks` is code."""

ADVICE = {
    # kind: (what it means, what to do)
    'lost_confirm': (
        'the broker never took responsibility for these messages: they may or may not be in a queue',
        'republish them (with a `message_id`, so consumers can de-duplicate); keep unconfirmed '
        'messages until their confirm, and republish after reconnecting'),
    'unknown_delivery_tag': (
        'the client acked a tag the broker did not consider outstanding; the broker closed the '
        'channel (406) and requeued everything unacked on it',
        'ack each delivery once, on the channel it came on, never after a channel was reopened, never'
        ' for `no_ack` consumers'),
    'confirm_nack': (
        'the broker refused these messages (queue limits with `reject-publish`, internal errors)',
        'republish or divert them; check queue length limits and overflow settings'),
    'unacked_buildup': (
        'a consumer holds deliveries without acking: they are invisible to other consumers and its '
        'queue backs up',
        'find the slow or stuck handler (the evidence names the delivery); ack on every code path; a '
        'prefetch of 100-300 and more consumers help'),
    'requeue_loop': (
        'a message keeps coming back because a consumer nacks or rejects it (or it cycles through '
        'dead-lettering)',
        'reject poison messages with `requeue=false` to a dead-letter exchange; use a quorum queue '
        '`delivery-limit`'),
    'redelivery_after_close': (
        'deliveries unacked when a channel closed were delivered again: work may be done twice',
        'make processing idempotent; ack before closing channels'),
    'unbounded_prefetch': (
        'a manual-ack consumer without a prefetch limit: the broker pushes the whole queue at it',
        'set `basic.qos` (100-300 is usual) before `basic.consume`'),
    'flow_blocked': (
        'the broker stopped reading from publishers (memory or disk alarm) or paused a channel',
        "look at the broker's memory and disk alarms"),
    'out_of_order_confirm': (
        'confirms arrived in another order than the publishes (normal with persistent and transient '
        'mixes)',
        'nothing, unless your publisher assumes order: match confirms by tag'),
    'unroutable_returned': (
        'a `mandatory` publish matched no queue and came back',
        "check the exchange's bindings and routing keys, or add an alternate exchange"),
    'unconfirmed_persistent_publish': (
        'persistent messages sent without confirms or transactions',
        'use publisher confirms where the messages matter'),
    'synchronous_confirms': (
        'the publisher waits for each confirm before the next publish: a few hundred messages a '
        'second at best',
        'keep a window of outstanding confirms and handle them asynchronously'),
}
