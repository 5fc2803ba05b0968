"""The agent against the traffic lab on the real RabbitMQ: lab scenarios recorded by the agent and by
dumpcap at once. The agent's frames must equal tshark's reading of dumpcap's file, its live counters
must match what the reference state machine finds in that file, and `ackscope analyze` of its lake
must find what ingest + analyze of the file finds."""

from __future__ import annotations

import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from analyzer import spec
from analyzer.ingest import ingest_file
from analyzer.timeline import replay_frames
from tests.agent_support import AgentProcess, lake_frames, methods_of_ports
from tests.lab.capture import read_capture
from tests.lab.lab import Lab, connection_name
from tests.lab.runner import exclusive_lab
from tests.lab.scenarios import SCENARIOS
from tests.tshark import frames_by_method

pytestmark = pytest.mark.rabbitmq

CONTENT_FRAMES = ("content.header", "content.body")
PSEUDO_ROWS = frozenset((spec.TCP_FIN, spec.TCP_RST, spec.PROTOCOL_HEADER, spec.CAPTURE_GAP, spec.CAPTURE_MIDSTREAM))
PROBLEM_COUNTERS = ("ackscope_lost_confirms_total", "ackscope_confirm_nacks_total",
                    "ackscope_unknown_delivery_tags_total", "ackscope_requeues_total", "ackscope_redeliveries_total",
                    "ackscope_out_of_order_confirms_total", "ackscope_returns_total")


class AgentRun:
    """One lab scenario driven while the agent and dumpcap both record loopback."""

    def __init__(self, name: str, out: Path):
        self.name = name
        self.lake = str(out / "agent-lake")
        self.capture_path = out / f"{name}.pcapng"
        self.samples_during: list = []

    def record(self, while_driving=None) -> "AgentRun":
        scenario = SCENARIOS[self.name]
        with exclusive_lab(), tempfile.TemporaryDirectory(prefix="ackscope-agent-lab-") as workdir, \
                AgentProcess(self.lake, agent_id=f"lab-{self.name}") as agent:
            lab = Lab(self.name, Path(workdir))
            failure = []

            def drive():
                try:
                    scenario.drive(lab)
                except BaseException as exc:  # reported by the test thread
                    failure.append(exc)

            driver = threading.Thread(target=drive)
            driver.start()
            if while_driving is not None:
                while_driving(agent, driver)
            driver.join()
            lab.cleanup()
            if failure:
                raise failure[0]
            lab.recording.keep_streams(self.capture_path, connection_name(self.name, ""), set(lab.names_by_port))
            self.samples_after = agent.samples()
            self.report = agent.stop()
        capture = read_capture(self.capture_path, lab.names_by_port)
        self.client_ports = {s.client_port for s in capture.streams.values()}
        return self

    def counter(self, name: str) -> float:
        prefix = connection_name(self.name, "")
        return sum(v for n, labels, v in self.samples_after
                   if n == name and labels.get("application", "").startswith(prefix))


def assert_same_frames(run: AgentRun) -> None:
    expected = frames_by_method(str(run.capture_path))
    for name in CONTENT_FRAMES:
        expected.pop(name, None)
    # Pseudo-rows (TCP ends, the protocol header, gaps) are the decoder's own, not AMQP frames.
    got = Counter({m: n for m, n in methods_of_ports(run.lake, run.client_ports).items() if m not in PSEUDO_ROWS})
    assert got == expected
    assert run.report["kernel_drops"] == 0
    assert run.report["gaps"] == 0


@pytest.fixture(scope="module")
def lost_confirms(tmp_path_factory) -> AgentRun:
    return AgentRun("lost_confirms", tmp_path_factory.mktemp("agent-lost")).record()


def test_lost_confirms_frames_equal_tsharks_and_the_counter_counts_each_lost_publish(lost_confirms):
    assert_same_frames(lost_confirms)
    reference_lake = str(Path(lost_confirms.lake).parent / "reference-lake")
    assert not ingest_file(str(lost_confirms.capture_path), reference_lake).errors
    publishes = replay_frames(lake_frames(reference_lake))["publishes"]
    lost = sum(1 for outcome, mode in zip(publishes["outcome"].to_pylist(), publishes["mode"].to_pylist())
               if outcome == "lost" and mode == "confirm")
    assert lost >= 10  # at least the aio-pika burst held back by the memory alarm
    assert lost_confirms.counter("ackscope_lost_confirms_total") == lost


def test_analyze_of_the_agents_lake_finds_what_ingest_and_analyze_of_dumpcaps_file_find(lost_confirms, spark):
    from analyzer import lake, schema
    from spark_jobs.analyze import analyze
    from tests.findings_check import LAB_THRESHOLDS

    reference_lake = str(Path(lost_confirms.lake).parent / "reference-lake-analysed")
    assert not ingest_file(str(lost_confirms.capture_path), reference_lake).errors
    prefix = connection_name(lost_confirms.name, "")

    def findings(lake_dir: str) -> Counter:
        analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
        table = lake.read_table(lake_dir, "findings", schema.FINDINGS).to_pylist()
        return Counter((f["kind"], f["connection_name"], f["channel"], f["count"]) for f in table
                       if (f["connection_name"] or "").startswith(prefix))

    expected = findings(reference_lake)
    assert ("lost_confirm", connection_name("lost_confirms", "broker-closed"), 1) in {k[:3] for k in expected}
    assert findings(lost_confirms.lake) == expected


def test_unacked_buildup_gauges_while_the_consumer_is_stuck(tmp_path):
    stuck = connection_name("unacked_buildup", "stuck-consumer")
    scrapes = []

    def scrape(agent: AgentProcess, driver: threading.Thread) -> None:
        while driver.is_alive():
            samples = agent.samples()
            unacked = sum(v for n, labels, v in samples
                          if n == "ackscope_unacked_deliveries" and labels["application"] == stuck)
            age = sum(v for n, labels, v in samples
                      if n == "ackscope_oldest_unacked_seconds" and labels["application"] == stuck)
            scrapes.append((time.monotonic(), unacked, age))
            time.sleep(0.3)

    run = AgentRun("unacked_buildup", tmp_path).record(while_driving=scrape)
    assert_same_frames(run)
    holding = [(t, age) for t, unacked, age in scrapes if unacked == 10]  # its prefetch, never acked
    assert len(holding) >= 2, scrapes
    (t0, age0), (t1, age1) = holding[0], holding[-1]
    assert age1 - age0 == pytest.approx(t1 - t0, abs=0.5) and age1 > age0  # the age grows with the clock
    # The consumers closed at the end: their channels (and series) are gone.
    assert not [s for s in run.samples_after if s[0] == "ackscope_unacked_deliveries"
                and s[1]["application"] == stuck and s[2]]


def test_clean_scenario_leaves_every_problem_counter_at_zero(tmp_path):
    run = AgentRun("clean_async_confirms", tmp_path).record()
    assert_same_frames(run)
    prefix = connection_name(run.name, "")
    confirmed = sum(v for n, labels, v in run.samples_after
                    if n == "ackscope_publish_confirm_seconds_count" and labels["application"].startswith(prefix))
    assert confirmed > 0  # the scenario's publishes reached the state machine and were counted
    for name in PROBLEM_COUNTERS:
        assert run.counter(name) == 0, name
