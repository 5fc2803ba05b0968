"""The live view of the state machine (analyzer.timeline.live): what the agent's gauges read."""

from analyzer.timeline import Timelines
from analyzer.timeline.live import open_connections

from .test_timeline import Conv


def fed(conv: Conv) -> Timelines:
    timelines = Timelines()
    for row in conv.rows:
        timelines.feed(row)
    return timelines


def only_channel(timelines: Timelines):
    (connection,) = open_connections(timelines)
    (channel,) = connection.channels
    return connection, channel


def test_unacked_and_unconfirmed_counts_follow_acks_and_confirms():
    conv = Conv()
    conv.open(1)
    conv.c(1, "basic.qos", prefetch_count=50, prefetch_global=False)
    conv.consume(1)
    first = conv.deliver(1, 1)
    conv.deliver(1, 2)
    conv.deliver(1, 3)
    conv.c(1, "confirm.select", nowait=False)
    conv.b(1, "confirm.select-ok")
    conv.publish(1, "p1")
    second_publish = conv.publish(1, "p2")
    _, channel = only_channel(fed(conv))
    assert (channel.unacked, channel.unconfirmed, channel.consumers) == (3, 2, 1)
    assert channel.oldest_unacked_ts_ns == conv.rows[first - 1]["ts_ns"]
    assert (channel.consumer_prefetch, channel.confirm_mode) == (50, True)

    conv.ack(1, 2, multiple=True)
    conv.confirm(1, 1)
    _, channel = only_channel(fed(conv))
    assert (channel.unacked, channel.unconfirmed) == (1, 1)
    assert channel.oldest_unacked_ts_ns == conv.rows[first + 1]["ts_ns"]  # tag 3 is the oldest now
    assert channel.oldest_unconfirmed_ts_ns == conv.rows[second_publish - 1]["ts_ns"]


def test_auto_ack_deliveries_are_not_unacked_and_cancelled_consumers_leave():
    conv = Conv()
    conv.open(1)
    conv.consume(1, tag="auto", no_ack=True)
    conv.consume(1, tag="manual")
    conv.deliver(1, 1, ctag="auto")
    conv.deliver(1, 2, ctag="manual")
    _, channel = only_channel(fed(conv))
    assert (channel.unacked, channel.consumers) == (1, 2)
    conv.c(1, "basic.cancel", consumer_tag="auto", nowait=False)
    conv.b(1, "basic.cancel-ok", consumer_tag="auto")
    _, channel = only_channel(fed(conv))
    assert channel.consumers == 1


def test_a_cancel_on_a_channel_never_opened_in_the_data_starts_no_incarnation():
    conv = Conv(midstream=True)
    conv.b(7, "basic.cancel-ok", consumer_tag="x")
    (connection,) = open_connections(fed(conv))
    assert connection.channels == ()


def test_blocked_connections_and_closed_channels():
    conv = Conv()
    conv.open(1)
    conv.open(2)
    conv.close(2)
    conv.b(0, "connection.blocked", reason="low on memory")
    connection, channel = only_channel(fed(conv))
    assert channel.channel == 1
    assert connection.blocked_since_ns == conv.rows[-1]["ts_ns"]
    conv.b(0, "connection.unblocked")
    connection, _ = only_channel(fed(conv))
    assert connection.blocked_since_ns is None
    conv.c(0, "connection.close", reply_code=200, reply_text="bye")
    assert list(open_connections(fed(conv)))[0].channels == ()
