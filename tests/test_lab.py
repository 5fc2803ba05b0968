"""The traffic lab end to end: every scenario drives the real RabbitMQ, is recorded with the
real dumpcap, and its capture, as tshark decodes it, shows the scenario's point in the raw
frames. Without a broker on 127.0.0.1:5672 or without dumpcap/tshark these tests fail; they
never skip, because a lab that silently records nothing would be worse than none.

The raw-frame checks here are deliberately simpler than the lab's own evidence (evidence.py):
they look for the one thing each scenario is about, so the two do not share a mistake.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lab.capture import Capture, Frame, read_lab_capture
from tests.lab.evidence import FINDING_KINDS, all_evidence
from tests.lab.expectations import expectations_document
from tests.lab.scenarios import SCENARIOS

pytestmark = [pytest.mark.rabbitmq, pytest.mark.tshark]

REPOSITORY = Path(__file__).resolve().parent.parent
# Small enough to bundle a set of them with the project.
MAX_CAPTURE_BYTES = 120 * 1024


@pytest.fixture(scope="module")
def lab_out(tmp_path_factory) -> Path:
    """Every scenario recorded once, through the command line a developer uses."""
    out = tmp_path_factory.mktemp("lab")
    result = subprocess.run([sys.executable, "-m", "tests.lab", "run", "all", "--out", str(out)],
                            cwd=REPOSITORY, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"the lab failed:\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def lab_capture(lab_out) -> Callable[[str], tuple[Capture, dict]]:
    """read_lab_capture of the recording, each scenario's decoded by tshark once: the tests below
    read a scenario's up to five times, and tests only read what it returns."""
    return functools.cache(functools.partial(read_lab_capture, lab_out))


def test_list_prints_every_scenario_once_per_line():
    result = subprocess.run([sys.executable, "-m", "tests.lab", "list"], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split("\n")[:-1] == list(SCENARIOS)
    assert len(SCENARIOS) == 17


def test_run_rejects_an_unknown_scenario(tmp_path):
    result = subprocess.run([sys.executable, "-m", "tests.lab", "run", "no_such_thing", "--out", str(tmp_path)],
                            cwd=REPOSITORY, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "no_such_thing" in result.stderr


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_capture_decodes_and_expectations_are_complete(lab_out, lab_capture, scenario):
    capture, expected = lab_capture(scenario)
    assert (lab_out / f"{scenario}.pcapng").stat().st_size < MAX_CAPTURE_BYTES
    assert any(frame.kind == "method" for frame in capture.frames)
    assert expected["scenario"] == scenario and expected["description"]
    named = {stream.connection_name for stream in capture.streams.values()}
    assert named == set(expected["facts"]["connections"]), "only the scenario's own connections, all named"
    pinned = {entry["connection_name"] for entry in expected["expect"] + expected["forbid_on"]}
    assert pinned <= named
    expected_kinds = {entry["kind"] for entry in expected["expect"]}
    tolerated = set(expected["facts"]["tolerated"])
    assert sorted(expected_kinds | tolerated | set(expected["forbid"])) == sorted(FINDING_KINDS)
    assert not (expected_kinds | tolerated) & set(expected["forbid"])
    assert all(entry["min_count"] >= 1 for entry in expected["expect"])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_expectations_follow_from_the_capture_on_disk(lab_capture, scenario):
    """Judged again from the file alone, the capture gives the same expectations."""
    capture, expected = lab_capture(scenario)
    evidence = all_evidence(capture)
    verdict = SCENARIOS[scenario].judge(capture, evidence)
    again = expectations_document(scenario, SCENARIOS[scenario].description, verdict, evidence,
                                  expected["facts"]["connections"])
    assert again["expect"] == expected["expect"]
    assert again["forbid"] == expected["forbid"]


# The point of each scenario, in the raw frames.

def connection(scenario: str, role: str) -> str:
    return f"lab-{scenario}-{role}"


def settled_by(settlements: list[Frame], published: int) -> dict[int, str]:
    """Tag -> the method that settled it; multiple=true covers the tags still open up to its tag."""
    settled: dict[int, str] = {}
    for frame in settlements:
        tags = range(1, frame.tag + 1) if frame.flag("multiple") else [frame.tag]
        settled.update({tag: frame.method for tag in tags if tag not in settled and tag <= published})
    return settled


def covered_tags(settlements: list[Frame], published: int) -> set[int]:
    return set(settled_by(settlements, published))


def broker_confirms(capture: Capture, name: str, channel: int = 1) -> list[Frame]:
    return [f for f in capture.frames if f.from_broker and f.method in ("basic.ack", "basic.nack")
            and capture.connection_name(f) == name and f.channel == channel]


def test_clean_async_confirms_confirms_every_publish_and_acks_every_delivery(lab_capture):
    capture, _ = lab_capture("clean_async_confirms")
    publisher, consumer = connection("clean_async_confirms", "publisher"), connection("clean_async_confirms", "consumer")
    published = len(capture.methods("basic.publish", connection_name=publisher))
    assert covered_tags(broker_confirms(capture, publisher), published) == set(range(1, published + 1))
    assert not capture.methods("basic.nack", connection_name=publisher)
    deliveries = capture.methods("basic.deliver", connection_name=consumer)
    acks = capture.methods("basic.ack", from_broker=False, connection_name=consumer)
    assert covered_tags(acks, len(deliveries)) == {d.tag for d in deliveries}
    assert {a.flag("multiple") for a in acks} == {True, False}


def test_lost_confirms_end_with_publishes_never_confirmed(lab_capture):
    capture, _ = lab_capture("lost_confirms")
    for role in ("tcp-cut", "broker-closed"):
        name = connection("lost_confirms", role)
        stream = capture.stream_named(name)
        published = len(capture.methods("basic.publish", connection_name=name))
        before_end = [c for c in broker_confirms(capture, name) if c.time <= stream.end_time]
        assert stream.ended and len(covered_tags(before_end, published)) < published, role
    forced = capture.methods("connection.close", from_broker=True, connection_name=connection("lost_confirms",
                                                                                              "broker-closed"))
    assert forced[0].args["reply_code"] == "320"


def test_confirm_nacks_come_from_the_broker(lab_capture):
    capture, _ = lab_capture("confirm_nacks")
    settled = settled_by(broker_confirms(capture, connection("confirm_nacks", "publisher")), 20)
    assert sorted(settled.values()) == ["basic.ack"] * 5 + ["basic.nack"] * 15


def test_out_of_order_confirms_ack_a_higher_tag_before_a_lower_one(lab_capture):
    capture, _ = lab_capture("out_of_order_confirms")
    confirmed: set[int] = set()
    overtaking = []
    for confirm in broker_confirms(capture, connection("out_of_order_confirms", "publisher")):
        if not confirm.flag("multiple") and not set(range(1, confirm.tag)) <= confirmed:
            overtaking.append(confirm.tag)
        confirmed |= covered_tags([confirm], 40)
    assert overtaking


def test_unacked_buildup_consumers_never_ack_while_deliveries_pile_up(lab_capture):
    capture, _ = lab_capture("unacked_buildup")
    unbounded, stuck = connection("unacked_buildup", "unbounded-consumer"), connection("unacked_buildup", "stuck-consumer")
    assert not capture.methods("basic.ack", from_broker=False)
    assert not capture.methods("basic.qos", connection_name=unbounded)
    assert len(capture.methods("basic.deliver", connection_name=unbounded)) > 10
    assert len(capture.methods("basic.deliver", connection_name=stuck)) == 10
    deliveries = capture.methods("basic.deliver", connection_name=unbounded)
    assert deliveries[-1].time - deliveries[0].time > 1.5


def test_requeue_loop_delivers_each_poison_message_again_and_again(lab_capture):
    capture, _ = lab_capture("requeue_loop")
    for role, message_id in (("nack-consumer", "poison-nack"), ("reject-consumer", "poison-reject"),
                             ("dead-letter-consumer", "poison-dead-letter")):
        deliveries = capture.methods("basic.deliver", connection_name=connection("requeue_loop", role))
        assert len(deliveries) >= 20 and {d.message_id for d in deliveries} == {message_id}, role
    dead_lettered = capture.methods("basic.deliver", connection_name=connection("requeue_loop", "dead-letter-consumer"))
    counts = [int(d.properties["headers"]["x-death"][0]["count"]) for d in dead_lettered[1:]]
    assert counts == list(range(1, len(dead_lettered)))


def test_unknown_delivery_tags_get_their_channels_closed_with_406(lab_capture):
    capture, _ = lab_capture("unknown_delivery_tag")
    closes = capture.methods("channel.close", from_broker=True)
    assert [(c.channel, c.args["reply_code"]) for c in closes] == [(1, "406"), (2, "406"), (4, "406")]
    for close in closes:
        acks = [a for a in capture.methods("basic.ack", from_broker=False, channel=close.channel)
                if a.number <= close.number]
        assert acks, f"an ack on channel {close.channel} before its close"


def test_redelivery_after_close_redelivers_what_was_left_unacked(lab_capture):
    capture, _ = lab_capture("redelivery_after_close")
    first = capture.methods("basic.deliver", connection_name=connection("redelivery_after_close", "first-consumer"))
    second = capture.methods("basic.deliver", connection_name=connection("redelivery_after_close", "second-consumer"))
    close = capture.methods("channel.close", from_broker=False,
                            connection_name=connection("redelivery_after_close", "first-consumer"))[0]
    assert all(d.flag("redelivered") and d.number > close.number for d in second)
    assert {d.message_id for d in second} < {d.message_id for d in first} and len(second) == 7


def test_unroutable_mandatory_returns_before_confirming(lab_capture):
    capture, _ = lab_capture("unroutable_mandatory")
    name = connection("unroutable_mandatory", "publisher")
    returns = capture.methods("basic.return", from_broker=True, connection_name=name)
    assert len(returns) == 10 and {r.args["reply_code"] for r in returns} == {"312"}
    assert covered_tags(broker_confirms(capture, name), 10) == set(range(1, 11))


def test_synchronous_publisher_waits_for_each_confirm_and_the_others_do_not(lab_capture):
    capture, _ = lab_capture("synchronous_confirms")

    def publishes_with_nothing_outstanding(role: str) -> tuple[int, int]:
        name = connection("synchronous_confirms", role)
        frames = [f for f in capture.frames if capture.connection_name(f) == name
                  and f.method in ("basic.publish", "basic.ack") and f.channel == 1]
        published, confirmed, lockstep = 0, set(), 0
        for frame in frames:
            if frame.method == "basic.publish":
                lockstep += confirmed == set(range(1, published + 1))
                published += 1
            elif frame.from_broker:
                confirmed |= covered_tags([frame], published)
        return lockstep, published

    lockstep, published = publishes_with_nothing_outstanding("sync-publisher")
    assert lockstep == published == 40
    for role in ("batch-publisher", "async-publisher"):
        lockstep, published = publishes_with_nothing_outstanding(role)
        assert lockstep <= published // 4, role


def test_persistent_without_confirms_publishes_persistent_on_a_plain_channel(lab_capture):
    capture, _ = lab_capture("persistent_without_confirms")
    name = connection("persistent_without_confirms", "plain-publisher")
    publishes = capture.methods("basic.publish", connection_name=name)
    assert len(publishes) == 20 and {p.properties["delivery_mode"] for p in publishes} == {"2"}
    assert not capture.methods("confirm.select", connection_name=name)
    assert not capture.methods("tx.select", connection_name=name)


def test_transactions_commit_and_roll_back_on_both_sides(lab_capture):
    capture, _ = lab_capture("transactions")
    for role in ("tx-publisher", "tx-consumer"):
        name = connection("transactions", role)
        for method in ("tx.select", "tx.commit", "tx.rollback"):
            assert capture.methods(method, from_broker=False, connection_name=name), (role, method)
    consumer_acks = capture.methods("basic.ack", from_broker=False, connection_name=connection("transactions",
                                                                                               "tx-consumer"))
    rollback = capture.methods("tx.rollback", connection_name=connection("transactions", "tx-consumer"))[0]
    assert any(a.number < rollback.number for a in consumer_acks) and any(a.number > rollback.number
                                                                          for a in consumer_acks)
    assert not capture.methods("channel.close", from_broker=True)


def test_flow_control_blocks_and_unblocks_both_publishers(lab_capture):
    capture, _ = lab_capture("flow_control")
    for role in ("pika-publisher", "py-amqp-publisher"):
        name = connection("flow_control", role)
        blocked = capture.methods("connection.blocked", from_broker=True, connection_name=name)
        unblocked = capture.methods("connection.unblocked", from_broker=True, connection_name=name)
        assert len(blocked) == 1 and len(unblocked) == 1 and blocked[0].number < unblocked[0].number, role


def test_polling_and_autoack_uses_get_get_empty_and_no_ack(lab_capture):
    capture, _ = lab_capture("polling_and_autoack")
    poller, autoack = connection("polling_and_autoack", "poller"), connection("polling_and_autoack", "autoack-consumer")
    gets = capture.methods("basic.get", from_broker=False, connection_name=poller)
    assert [g.flag("no_ack") for g in gets] == [False] * 3 + [True] * 2 + [False]
    assert len(capture.methods("basic.get-empty", connection_name=poller)) == 1
    assert capture.methods("basic.consume", connection_name=autoack)[0].flag("no_ack")
    assert not capture.methods("basic.ack", connection_name=autoack)


def test_channel_reuse_opens_one_channel_number_three_times(lab_capture):
    capture, _ = lab_capture("channel_reuse")
    opens = capture.methods("channel.open", from_broker=False)
    closes = capture.methods("channel.close", from_broker=False)
    assert [f.channel for f in opens] == [1, 1, 1] and len(closes) == 3
    first_confirms = [c.tag for c in broker_confirms(capture, connection("channel_reuse", "client"))
                      if opens[1].number < c.number < closes[1].number]
    assert min(first_confirms) <= 3, "confirm numbering starts again on the second incarnation"


def test_mid_stream_capture_starts_without_a_handshake_and_high_tags(lab_capture):
    capture, _ = lab_capture("mid_stream")
    assert not capture.methods("connection.start") and not capture.methods("channel.open")
    assert capture.methods("basic.deliver")[0].tag > 1000
    assert not any(stream.ended for stream in capture.streams.values())


def test_heartbeats_flow_both_ways_on_an_idle_connection(lab_capture):
    capture, _ = lab_capture("heartbeats")
    name = connection("heartbeats", "idle")
    assert len(capture.heartbeats(from_broker=True, connection_name=name)) >= 2
    assert len(capture.heartbeats(from_broker=False, connection_name=name)) >= 2
    assert {f.method for f in capture.frames if f.kind == "method"} <= {
        "connection.start", "connection.start-ok", "connection.tune", "connection.tune-ok", "connection.open",
        "connection.open-ok", "channel.open", "channel.open-ok", "connection.close", "connection.close-ok",
        "channel.close", "channel.close-ok"}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_analyzer_decodes_every_scenario_like_tshark(lab_out, lab_capture, scenario):
    """ackscope's decoder against tshark on each freshly recorded scenario: the same frames by method,
    no decoding errors, and every connection the lab named is found with its name."""
    from analyzer.ingest import decode

    from tests.tshark import frames_by_method as tshark_frames_by_method

    path = str(lab_out / f"{scenario}.pcapng")
    report, connections = decode(path, lambda table: None)
    assert report.errors == []
    assert report.frames_by_method == tshark_frames_by_method(path)
    _, expected = lab_capture(scenario)
    if scenario != "mid_stream":  # its connections were opened before the recording: no names on the wire
        assert set(expected["facts"]["connections"]) <= {c["connection_name"] for c in connections}


@pytest.fixture(scope="module")
def lab_lake(lab_out, spark, tmp_path_factory) -> str:
    """Every freshly recorded scenario ingested into one lake and analysed on Spark."""
    from analyzer.ingest import ingest_file
    from spark_jobs.analyze import analyze

    from tests.findings_check import LAB_THRESHOLDS

    lake_dir = str(tmp_path_factory.mktemp("lab-lake"))
    for scenario in SCENARIOS:
        assert not ingest_file(str(lab_out / f"{scenario}.pcapng"), lake_dir).errors
    analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    return lake_dir


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_analysis_finds_what_each_scenario_expects_and_nothing_it_forbids(lab_out, lab_capture, lab_lake, scenario):
    from tests.findings_check import findings_of_capture, problems

    _, expected = lab_capture(scenario)
    assert problems(findings_of_capture(lab_lake, str(lab_out / f"{scenario}.pcapng")), expected) == []
