"""The agent's continuous decode (sans-IO, plain segments): rows reach the state machine in order even
when a message's body arrives after later frames, a lost packet becomes a capture gap and no false
finding, and ended connections leave the agent's memory."""

from __future__ import annotations

from pamqp import commands

from analyzer.agent.decoder import LiveDecoder
from analyzer.agent.live_state import PROBLEM_COUNTERS, LiveState
from analyzer.labels import SeriesCaps
from analyzer.packets import LINKTYPE_ETHERNET
from analyzer.timeline.live import open_connections
from tests.wire import Conversation, content, handshake, method

NOW = 1_700_000_000_000_000_000


class Live:
    """A LiveDecoder and LiveState fed segments directly, with a fixed clock."""

    def __init__(self, idle_timeout_s: float = 600.0):
        self.now = NOW
        self.decoder = LiveDecoder(source="test", agent_id="t", broker_ports=(5672,), linktype=LINKTYPE_ETHERNET,
                                   idle_timeout_s=idle_timeout_s, clock=lambda: self.now)
        self.state = LiveState(SeriesCaps())
        self.number = 0

    def feed(self, segments) -> None:
        for seg in segments:
            self.number += 1
            self.now += 1000
            self.decoder.flows.packet(self.number, self.now, seg)

    def tick(self, end_all: bool = False):
        frames, rows, connection_rows, ended = self.decoder.take(end_all=end_all)
        self.state.feed(rows, ended, self.decoder.connection_facts())
        return frames, rows, connection_rows

    def channels(self) -> dict:
        return {ch.channel: ch for conn in open_connections(self.state.timelines) for ch in conn.channels}


def _confirming_consumer(conv: Conversation, name: str = "ordering") -> list:
    return conv.open() + conv.script(handshake(name=name) + [
        (0, method(commands.Confirm.Select())), (1, method(commands.Confirm.SelectOk())),
        (0, method(commands.Channel.Open(), 2)), (1, method(commands.Channel.OpenOk(), 2)),
        (0, method(commands.Basic.Consume(queue="q", consumer_tag="c"), 2)),
        (1, method(commands.Basic.ConsumeOk("c"), 2))])


def test_rows_after_a_message_still_arriving_wait_for_it():
    live, conv = Live(), Conversation()
    live.feed(_confirming_consumer(conv))
    live.tick()
    publish = content(commands.Basic.Publish(exchange="", routing_key="q"), b"payload")
    cut = len(publish) - 3  # the method and header now, the body's last bytes later
    live.feed(conv.send(0, publish[:cut]))
    live.feed(conv.send(1, content(commands.Basic.Deliver("c", 1, False, "", "q"), b"m", channel=2)))
    _, rows, _ = live.tick()
    assert [r["method"] for r in rows if r["channel"] == 2] == []  # the deliver waits behind the publish
    live.feed(conv.send(0, publish[cut:]))
    _, rows, _ = live.tick()
    assert [r["method"] for r in rows] == ["basic.publish", "basic.deliver"]
    assert live.state.timeline_errors == 0
    channels = live.channels()
    assert (channels[1].unconfirmed, channels[2].unacked) == (1, 1)


def test_a_lost_packet_becomes_a_gap_and_no_lost_confirm():
    live, conv = Live(), Conversation()
    live.feed(_confirming_consumer(conv))
    live.feed(conv.send(0, b"".join(content(commands.Basic.Publish(exchange="", routing_key="q"), b"m%d" % n)
                                    for n in range(3))))
    conv.send(1, method(commands.Basic.Ack(delivery_tag=3, multiple=True)))  # dropped by the kernel
    live.feed([conv.ack(0)])      # the client acknowledges bytes the agent never saw
    live.feed([conv.fin(0), conv.fin(1)])
    live.tick()
    live.tick(end_all=True)
    live.state.end_of_data()
    assert live.decoder.gaps() == 1
    assert set(live.state.counters["ackscope_lost_confirms_total"].values()) == {0}  # unknown, not lost


def test_ended_and_idle_connections_leave_memory():
    live = Live(idle_timeout_s=5)
    quiet, closed = Conversation(client=(bytes([10, 0, 0, 7]), 40001)), Conversation()
    live.feed(_confirming_consumer(quiet) + _confirming_consumer(closed))
    live.feed([closed.fin(0), closed.fin(1)])
    _, _, ended = live.tick()
    assert [row["ended_by"] for row in ended] == ["tcp.fin"]
    live.now += 6 * 10**9
    _, _, ended = live.tick()
    assert [row["ended_by"] for row in ended] == ["idle-timeout"]
    live.now += 60 * 10**9  # past the linger
    live.tick()
    assert live.decoder.flows.connections == [] and live.decoder.flows.flows == {}
    assert live.state.timelines.connections == {} and live.decoder.rows.connections == {}


def test_a_lingering_connection_is_not_handed_to_the_live_state_again():
    """Issue 62: an ended connection stays in the flow table for its linger, and every tick handed its
    facts to the live state again after the state had let them go: one facts dict kept for ever per
    connection the agent ever saw. Its shared connection id goes with it too."""
    live = Live()
    closed, open_ = Conversation(), Conversation(client=(bytes([10, 0, 0, 7]), 40001))
    live.feed(_confirming_consumer(closed) + _confirming_consumer(open_))
    closed_id, open_id = (conn.id for conn in live.decoder.flows.connections)
    assert open_id.startswith("10.0.0.7:")
    live.feed([closed.fin(0), closed.fin(1)])
    live.tick()
    for _ in range(3):  # ticks within the linger
        live.now += 10**9
        live.tick()
    assert list(live.state.facts) == [open_id]
    live.now += 60 * 10**9
    live.tick()
    assert closed_id not in live.decoder._strings and open_id in live.decoder._strings
    assert list(live.state.facts) == [open_id]


def test_a_message_waiting_for_its_body_keeps_its_connection_when_others_are_forgotten():
    """Issue 62: a publish whose body arrives after an earlier connection was forgotten (its linger
    over) was filed by a stale position: past the end (a crash) or under another connection."""
    for bystanders in (1, 2):
        live = Live()
        gone = Conversation(client=(bytes([10, 0, 0, 2]), 40002))
        waiting = Conversation(client=(bytes([10, 0, 0, 3]), 40003))
        others = [Conversation(client=(bytes([10, 0, 0, 4 + n]), 40004 + n)) for n in range(bystanders - 1)]
        live.feed(_confirming_consumer(gone, "gone") + _confirming_consumer(waiting, "waiting"))
        for other in others:
            live.feed(_confirming_consumer(other, "bystander"))
        publish = content(commands.Basic.Publish(exchange="", routing_key="q"), b"payload")
        cut = len(publish) - 3
        live.feed(waiting.send(0, publish[:cut]))  # the method and header now, the body's end later
        live.feed([gone.fin(0), gone.fin(1)])
        live.tick()
        live.now += 60 * 10**9  # past the linger: `gone` is forgotten while the publish waits
        live.tick()
        assert all(conn.id.startswith(("10.0.0.3", "10.0.0.4")) for conn in live.decoder.flows.connections)
        live.feed(waiting.send(0, publish[cut:]))
        frames, rows, _ = live.tick()
        publishes = [row for row in frames.to_pylist() if row["method"] == "basic.publish"]
        assert [row["client_addr"] for row in publishes] == ["10.0.0.3"]
        assert [row["connection_id"] for row in rows if row["method"] == "basic.publish"] == \
            [publishes[0]["connection_id"]]


def test_a_row_the_sink_cannot_place_is_refused_not_misfiled():
    from analyzer.rows import RowSink, UnplacedRow
    import pytest
    sink = RowSink()
    kept = sink.add_connection(("kept", "a", "s", "10.0.0.1", 1, "10.0.0.9", 5672))
    dropped = sink.add_connection(("dropped", "a", "s", "10.0.0.2", 2, "10.0.0.9", 5672))
    sink.forget_connection(dropped)
    sink.acks.append((kept, 1, 1, 0, 1, "basic.ack", 1, 1, False, None))
    sink.acks.append((dropped, 1, 1, 0, 1, "basic.ack", 2, 1, False, None))
    with pytest.raises(UnplacedRow):
        sink.take()


def test_an_applications_problem_counters_exist_at_zero_from_its_connection_open():
    """increase() needs a sample before the first loss: a counter born at 3 would never alert."""
    live, conv = Live(), Conversation()
    live.feed(_confirming_consumer(conv, "first-loss"))
    live.tick()
    counters = live.state.counters
    assert {name: dict(values) for name, values in counters.items()} == \
        {name: {("/", "first-loss"): 0} for name in PROBLEM_COUNTERS}
    live.feed(conv.send(0, b"".join(content(commands.Basic.Publish(exchange="", routing_key="q"), b"m%d" % n)
                                    for n in range(3))))
    live.feed([conv.ack(0), conv.rst(0)])  # the publisher dies with its three publishes unconfirmed
    live.tick()
    assert counters["ackscope_lost_confirms_total"] == {("/", "first-loss"): 3}


def test_the_cap_admits_applications_in_the_order_their_connections_opened():
    """Both connections open within one batch, and the later one's id sorts first (its address):
    the cap still keeps the one whose connection.open-ok came first, however the ticks fall."""
    for ticks_between in (False, True):
        live = Live()
        live.state = LiveState(SeriesCaps(max_applications=1))
        early = Conversation(client=(bytes([10, 0, 0, 9]), 50001))
        late = Conversation(client=(bytes([10, 0, 0, 1]), 40001))
        live.feed(_confirming_consumer(early, "opened-first"))
        if ticks_between:
            live.tick()
        live.feed(_confirming_consumer(late, "opened-second"))
        _, rows, _ = live.tick()
        if not ticks_between:
            assert [r["connection_id"] for r in rows][0].startswith("10.0.0.1:")  # late's rows come first
        assert live.state.caps.application.admitted == {"opened-first"}
        assert dict(live.state.counters["ackscope_lost_confirms_total"]) == \
            {("/", "opened-first"): 0, ("/", "other"): 0}
        assert live.state.folded_series() == {name: 1 for name in PROBLEM_COUNTERS}


def test_churn_of_new_application_names_counts_each_folded_series_once_per_metric_in_little_memory():
    """Under churn every short connection may name a new application: past the cap each is folded,
    counted once per metric, and the agent remembers which it counted. It held a (series, metric)
    pair each, ~1.7 KB a series (21 MB at 9,000 series of 11 metrics): now one entry a series."""
    import tracemalloc

    from analyzer.agent.live_state import ACK_LATENCY, CONFIRM_LATENCY
    metrics = [*PROBLEM_COUNTERS, CONFIRM_LATENCY, ACK_LATENCY, "ackscope_unacked_deliveries"]
    state = LiveState(SeriesCaps(max_applications=2))
    series = 9_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(series):
            connection_id = f"10.0.0.1:{n}>10.0.0.2:5672@{n}"
            state.facts[connection_id] = {"connection_name": f"churn-{n}", "vhost": "/"}
            for _ in range(2):  # asked again (every record, every scrape): counted once
                assert [state._folded(connection_id, m) for m in metrics] == \
                    [("/", f"churn-{n}" if n < 2 else "other")] * len(metrics)
            del state.facts[connection_id]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert state.folded_series() == {m: series - 2 for m in metrics}
    assert state.caps.folds_by_label() == {"vhost": 0, "application": (series - 2) * len(metrics)}
    assert held < 5 * 2**20, f"{held / 2**20:.1f} MB held for {series:,} series"
