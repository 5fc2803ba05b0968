"""A property of the live decoder (issue 62): whatever the connections' open, close, reset, idle and
linger timings and wherever take() falls, the agent files the same frame rows per connection as the
offline decode of the same segments (FlowTable, as `ackscope ingest` runs it), each once, and hands
the state machine every row of a connection in seq order.

Connections interleave at random, messages are cut across segments (so rows wait for their bodies
across takes), ended connections are forgotten past their linger while others still have rows
waiting, and client ports are reused (a new connection on the 4-tuple of an earlier one)."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from analyzer.agent.decoder import LINGER_S
from analyzer.flows import FlowTable
from analyzer.rows import RowSink
from tests.test_agent_decoder import NOW as START, Live
from tests.wire import Conversation, content, handshake, method

IDLE_TIMEOUT_S = 1000.0
PAST_LINGER_NS = int((LINGER_S + 1) * 1e9)
MAX_LINGER_JUMPS = 20  # 20 jumps past the linger stay below the idle timeout: only idle connections expire
PAST_IDLE_NS = int((IDLE_TIMEOUT_S + 1) * 1e9)

messages = st.lists(st.tuples(st.sampled_from(("publish", "deliver")), st.binary(max_size=40),
                              st.sampled_from((0, 7)), st.integers(0, 2)), max_size=4)
connections = st.lists(st.tuples(messages, st.sampled_from(("fin", "rst", "none")), st.integers(0, 2)),
                       min_size=1, max_size=5)


def _script(conv: Conversation, number: int, msgs, end: str, draw) -> list[list]:
    """A connection's segments in the chunks the interleaving may not split."""
    chunks = [conv.open() + conv.script(handshake(name=f"prop-{number}") + [
        (0, method(commands.Confirm.Select())), (1, method(commands.Confirm.SelectOk())),
        (0, method(commands.Channel.Open(), 2)), (1, method(commands.Channel.OpenOk(), 2)),
        (0, method(commands.Basic.Consume(queue="q", consumer_tag="c"), 2)),
        (1, method(commands.Basic.ConsumeOk("c"), 2))])]
    published = delivered = 0
    for kind, body, frame_size, cuts in msgs:
        if kind == "publish":
            published += 1
            data, direction = content(commands.Basic.Publish(exchange="", routing_key="q"), body,
                                      frame_size=frame_size), 0
        else:
            delivered += 1
            data, direction = content(commands.Basic.Deliver("c", delivered, False, "", "q"), body, channel=2,
                                      frame_size=frame_size), 1
        at = sorted(draw(st.lists(st.integers(1, len(data) - 1), min_size=cuts, max_size=cuts, unique=True)))
        for start, stop in zip([0] + at, at + [len(data)]):  # each piece its own chunk: takes fall between
            chunks.append(conv.send(direction, data[start:stop]))
        if kind == "publish":
            chunks.append(conv.send(1, method(commands.Basic.Ack(delivery_tag=published))))
        else:
            chunks.append(conv.send(0, method(commands.Basic.Ack(delivery_tag=delivered), 2)))
    if end == "fin":
        chunks.append([conv.fin(0), conv.fin(1)])
    elif end == "rst":
        chunks.append([conv.rst(0)])
    return chunks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(connections, st.data())
def test_the_live_decoder_files_what_the_offline_decode_files(specs, data):
    draw = data.draw
    scripts, port_of = [], []
    for number, (msgs, end, port) in enumerate(specs):
        conv = Conversation(client=(bytes([10, 0, 0, 1]), 40000 + port), client_isn=1000 + 100_000 * number)
        scripts.append(_script(conv, number, msgs, end, draw))
        port_of.append(port)
    # Interleave: a connection starts once the last one on its ports has sent everything.
    now = START
    events, next_chunk, linger_jumps = [], [0] * len(scripts), 0
    while True:
        startable = [i for i, script in enumerate(scripts) if next_chunk[i] < len(script) and all(
            next_chunk[j] == len(scripts[j]) for j in range(i) if port_of[j] == port_of[i])]
        if not startable:
            break
        choice = draw(st.sampled_from(("chunk", "chunk", "chunk", "take", "linger", "idle")))
        if choice == "take":
            events.append(("take", now))
        elif choice == "linger" and linger_jumps < MAX_LINGER_JUMPS:
            linger_jumps += 1
            now += PAST_LINGER_NS
            events.append(("take", now))
        elif choice == "idle" and all(next_chunk[i] == 0 for i in startable):
            now += PAST_IDLE_NS  # every connection begun has sent all it will: they may expire
            linger_jumps = 0
            events.append(("take", now))
        else:
            i = draw(st.sampled_from(startable))
            for seg in scripts[i][next_chunk[i]]:
                now += 1000
                events.append(("packet", now, seg))
            next_chunk[i] += 1

    live = Live(idle_timeout_s=IDLE_TIMEOUT_S)
    live.now = START
    offline = RowSink()
    table = FlowTable(sink=offline, counts={}, errors=[], source="test", agent_id="t")
    live_frames, timeline_seqs = [], defaultdict(list)

    def take(end_all: bool = False) -> None:
        frames, rows, _ = live.tick(end_all=end_all)
        if frames is not None:
            live_frames.extend(frames.to_pylist())
        for row in rows:
            timeline_seqs[row["connection_id"]].append(row["seq"])

    number = 0
    for event in events:
        if event[0] == "take":
            live.now = event[1]
            take()
            continue
        _, ts, seg = event
        number += 1
        live.now = ts
        live.decoder.flows.packet(number, ts, seg)
        table.packet(number, ts, seg)
    live.now += 1000
    take(end_all=True)
    table.finish()

    decoder = live.decoder
    assert decoder.errors == [] and decoder.kept_errors == [] and live.state.timeline_errors == 0
    keys = [(row["connection_id"], row["seq"]) for row in live_frames]
    assert len(keys) == len(set(keys)), "a (connection_id, seq) filed twice"
    by_connection = lambda rows: {cid: sorted((r for r in rows if r["connection_id"] == cid), key=lambda r: r["seq"])
                                  for cid in {r["connection_id"] for r in rows}}
    expected = by_connection(offline.take().to_pylist())
    assert by_connection(live_frames) == expected
    for cid, rows in expected.items():  # the state machine saw every row, in order
        assert timeline_seqs[cid] == [r["seq"] for r in rows]
