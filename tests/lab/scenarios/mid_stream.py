"""A capture that begins and ends in the middle of busy connections: no protocol header, no
connection.start, confirm mode and the consumer already set up, tags already past 1000,
confirms and deliveries in flight at both ends. Nothing in it may be called a finding: what
happened before and after is unknown, not missing."""

from __future__ import annotations

import threading
import time

from tests.lab.clients import amqp_connection
from tests.lab.expectations import Verdict, require
from tests.lab.lab import Lab, connection_name
from tests.lab.scenario import Scenario
from tests.lab.scenarios.confirming import ConfirmingPublisher
from tests.lab.scenarios.waiting import Deadline

NAME = "mid_stream"
PUBLISHER = connection_name(NAME, "publisher")
CONSUMER = connection_name(NAME, "consumer")
WARM_UP, PREFETCH, ACK_EVERY = 1000, 50, 10
BURST, BURST_INTERVAL, RECORDED_SECONDS = 5, 0.05, 1.0


def drive(lab: Lab) -> None:
    queue = lab.queue("busy", durable=True)
    publisher_connection, consumer_connection = amqp_connection(PUBLISHER), amqp_connection(CONSUMER)
    traffic = Traffic(publisher_connection, consumer_connection, queue)
    try:
        lab.names_by_port.update({connection.sock.getsockname()[1]: name for connection, name in
                                  ((publisher_connection, PUBLISHER), (consumer_connection, CONSUMER))})
        traffic.warm_up()
        # The recording starts and stops while the traffic thread keeps publishing, confirming,
        # delivering and acking.
        worker = threading.Thread(target=traffic.run, name="mid_stream traffic")
        worker.start()
        try:
            with lab.recorded():
                time.sleep(RECORDED_SECONDS)
        finally:
            traffic.stop.set()
            worker.join(timeout=30)
        if traffic.failure:
            raise traffic.failure
    finally:
        publisher_connection.close()
        consumer_connection.close()


class Traffic:
    """A confirm-mode publisher and a prefetch-limited consumer acking every 10th delivery
    with multiple=true, both py-amqp, driven from one thread."""

    def __init__(self, publisher_connection, consumer_connection, queue: str):
        self.publisher = ConfirmingPublisher(publisher_connection)
        self.consumer_connection, self.queue = consumer_connection, queue
        self.received = 0
        self.stop = threading.Event()
        self.failure: Exception | None = None
        channel = consumer_connection.channel()
        channel.basic_qos(0, PREFETCH, False)
        channel.basic_consume(queue, callback=self._on_delivery)
        self.consumer_channel = channel

    def warm_up(self) -> None:
        """Push tags past 1000 before the recording."""
        while self.publisher.published < WARM_UP:
            self._round(burst=100)
        deadline = Deadline(20, "the warm-up deliveries")
        while self.received < self.publisher.published:
            deadline.check()
            self._drain(self.consumer_connection)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._round(burst=BURST)
                time.sleep(BURST_INTERVAL)
        except Exception as failure:  # reported by drive(), in the main thread
            self.failure = failure

    def _round(self, burst: int) -> None:
        number = self.publisher.published
        self.publisher.publish_windowed(
            [(b"event %d" % n, self.queue, {"message_id": f"event-{n}", "persistent": True})
             for n in range(number, number + burst)], window=burst * 2)
        self._drain(self.consumer_connection)

    def _on_delivery(self, message) -> None:
        self.received += 1
        if self.received % ACK_EVERY == 0:
            self.consumer_channel.basic_ack(message.delivery_tag, multiple=True)

    @staticmethod
    def _drain(connection) -> None:
        try:
            connection.drain_events(timeout=0.02)
        except TimeoutError:
            pass


def judge(capture, evidence) -> Verdict:
    require(not capture.methods("connection.start"), "no connection.start (the capture begins mid-connection)")
    deliveries = capture.methods("basic.deliver", connection_name=CONSUMER)
    confirms = capture.methods("basic.ack", from_broker=True, connection_name=PUBLISHER)
    require(bool(deliveries) and deliveries[0].tag > WARM_UP, f"first delivery tag past {WARM_UP}")
    require(bool(confirms) and confirms[0].tag > WARM_UP, f"first confirm tag past {WARM_UP}")
    require(not any(capture.streams[s].ended for s in {f.stream for f in capture.frames}),
            "both connections still open when the capture ends")
    return Verdict(expect=[], facts={"first_delivery_tag": deliveries[0].tag, "first_confirm_tag": confirms[0].tag,
                                     "deliveries": len(deliveries), "confirm_frames": len(confirms)},
                   tolerated={"unacked_buildup": "the consumer (set up before the capture, so of unknown ack mode to "
                                                 "the lab, proven manual by its acks) keeps its prefetch of 50 full for "
                                                 "the whole second recorded: its oldest delivery may pass the lab-scale "
                                                 "age threshold"})


SCENARIO = Scenario(
    name=NAME,
    description=("py-amqp publisher in confirm mode and py-amqp consumer (prefetch 50, acks every 10th with "
                 "multiple=true) exchange 1000 persistent messages before the recording starts; it records about "
                 "a second of their traffic (bursts of 5 every 50 ms) and stops while they are still busy. "
                 "Nothing to flag: what is outside the capture is unknown."),
    drive=drive,
    judge=judge,
)
