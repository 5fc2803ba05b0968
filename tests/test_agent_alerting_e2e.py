"""End to end with a running agent: a real Prometheus scrapes `ackscope capture --iface lo` with the
generated rules (lab scale), real RabbitMQ traffic makes the live pathologies, and a real
Alertmanager sends what fires to a webhook this test serves.

- The lab's lost_confirms scenario: two publishers the agent has never seen lose confirm-mode
  publishes (one resets its TCP connection after a burst, one is closed by the broker while a
  memory alarm holds its publishes). Their very first lost confirms raise AmqpLostConfirms, whether
  Prometheus scraped their counters at 0 first (increase()) or only once counted (a new series).
- A consumer that holds its deliveries unacked raises AmqpUnackedBuildup and AmqpOldestUnackedTooOld.
- The lab's clean_async_confirms scenario fires nothing of warning or worse.
- Every query of the agent-health dashboard returns data; every other panel query that reads the
  agent's metrics is accepted by Prometheus.
- The agent stopped: AmqpAgentDown (its target down); its target gone: AmqpAgentDown (absent).

Intervals are a second and every `for` is 0 (both sides of each are promtool's, test_rules.py);
`new_series_window_seconds` is 10 s, so the test waits until Prometheus has scraped the agent that
long before the scenario.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from dashboards import rules
from dashboards.alert_settings import AlertSettings
from dashboards.grafana import panel_queries
from tests.agent_support import AgentProcess, send_and_close
from tests.findings_check import LAB_THRESHOLDS
from tests.lab.clients import pika_connection
from tests.lab.lab import Lab, connection_name
from tests.lab.runner import exclusive_lab
from tests.lab.scenarios import SCENARIOS

from .prometheus_stack import (Webhook, alertmanager, prometheus, query, reload_prometheus, settle,
                               write_prometheus_config)

pytestmark = pytest.mark.rabbitmq

NEW_SERIES_WINDOW = 10
SETTINGS = AlertSettings.from_pairs(
    [f"{name}=0" for name in AlertSettings.names() if name.endswith("_for_seconds")]
    + [f"oldest_unacked_seconds={LAB_THRESHOLDS.unacked_age_seconds}", "unacked_deliveries=5",
       f"new_series_window_seconds={NEW_SERIES_WINDOW}"])
JOB = SETTINGS.agent_job
AGENT_DASHBOARD = "ackscope-agent"
STUCK = "agent-e2e-stuck-consumer"
TIMEOUT = 45


def wait_for(condition, what: str, timeout: float = TIMEOUT, during=None):
    return settle(condition, what, timeout, during)


def received(webhook: Webhook, alertname: str, **labels) -> list[dict]:
    return [a for a in webhook.received() if a["labels"]["alertname"] == alertname
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def lost_by_application(agent: AgentProcess, prefix: str) -> dict[str, float]:
    return {labels["application"]: value for name, labels, value in agent.samples()
            if name == "ackscope_lost_confirms_total" and labels["application"].startswith(prefix)}


def first_scraped(prometheus_url: str, metric: str, application: str) -> float:
    """The first value Prometheus scraped of the application's counter (0: born before the loss)."""
    result = query(prometheus_url, f'{metric}{{application="{application}"}}[5m]')
    return min(float(value) for series in result for _, value in series["values"][:1])


def hold_unacked_deliveries(webhook: Webhook) -> None:
    """A consumer with prefetch 10 that never acks, held until its alerts reach the webhook."""
    with pika_connection("agent-e2e-producer") as producer, pika_connection(STUCK) as consumer:
        channel = consumer.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        publisher = producer.channel()
        for number in range(30):
            publisher.basic_publish("", queue, b"task %d" % number)
        channel.basic_qos(prefetch_count=10)
        channel.basic_consume(queue, lambda *delivery: None, auto_ack=False)
        for alertname in ("AmqpUnackedBuildup", "AmqpOldestUnackedTooOld"):
            wait_for(lambda: received(webhook, alertname, application=STUCK), f"no {alertname} for {STUCK}",
                     during=lambda: consumer.process_data_events(time_limit=0.5))


def drive_lab_scenario(name: str) -> None:
    with exclusive_lab(), tempfile.TemporaryDirectory(prefix="ackscope-agent-e2e-") as workdir:
        lab = Lab(name, Path(workdir))
        try:
            SCENARIOS[name].drive(lab)
        finally:
            lab.cleanup()


def test_a_running_agent_feeds_prometheus_alertmanager_and_the_agent_dashboard(tmp_path):
    tmp = str(tmp_path)
    rules_file = os.path.join(tmp, "ackscope.rules.yml")
    with open(rules_file, "w") as out:
        out.write(rules.rules_yaml(SETTINGS))
    webhook = Webhook()
    agent = AgentProcess(str(tmp_path / "lake"), agent_id="e2e", flush_interval=1.0)
    target = f"127.0.0.1:{agent.port}"
    scrape_configs = [{"job_name": JOB, "static_configs": [{"targets": [target]}]}]
    with agent, alertmanager(tmp, webhook) as (_, alertmanager_port), \
            prometheus(tmp, rules_file, alertmanager_port, scrape_configs) as prometheus_url:
        wait_for(lambda: query(prometheus_url, f'up{{job="{JOB}"}} == 1'), "the agent never scraped")

        hold_unacked_deliveries(webhook)
        for alert in received(webhook, "AmqpUnackedBuildup", application=STUCK):
            assert STUCK in alert["annotations"]["description"]
        send_and_close(b"AMQP\x00\x01\x00\x00")  # an unsupported flow (AMQP 1.0), for its panel

        # A counter series new within the window alerts only where Prometheus knew the agent then.
        wait_for(lambda: query(prometheus_url, f'up{{job="{JOB}"}} offset {NEW_SERIES_WINDOW}s'),
                 f"Prometheus has not scraped the agent for {NEW_SERIES_WINDOW}s")
        prefix = connection_name("lost_confirms", "")
        assert not lost_by_application(agent, prefix)  # never seen before the scenario
        drive_lab_scenario("lost_confirms")
        closed = connection_name("lost_confirms", "broker-closed")  # its memory alarm holds its publishes
        wait_for(lambda: lost_by_application(agent, prefix).get(closed), f"the agent counted no lost confirm of {closed}")
        lost = {app: n for app, n in lost_by_application(agent, prefix).items() if n}
        for application in lost:
            (alert, *_) = wait_for(lambda: received(webhook, "AmqpLostConfirms", application=application),
                                   f"no AmqpLostConfirms for {application} (lost {lost})")
            assert alert["labels"]["severity"] == "critical"
            assert application in alert["annotations"]["description"]
            print(f"{application}: {lost[application]:g} lost; first scraped at "
                  f"{first_scraped(prometheus_url, 'ackscope_lost_confirms_total', application):g}")

        drive_lab_scenario("clean_async_confirms")
        check_agent_panel_queries(prometheus_url)
        check_clean_traffic_is_quiet(prometheus_url, webhook, connection_name("clean_async_confirms", ""))
        agent.stop()
        down = wait_for(lambda: received(webhook, "AmqpAgentDown", instance=target), "no AmqpAgentDown for the agent")
        assert down[0]["labels"]["job"] == JOB

        # The target gone, as when service discovery no longer finds the agent's pod. (Prometheus
        # 2.42 goes on scraping a job removed from the configuration by a reload: the job stays and
        # drops its targets instead.)
        dropped = {**scrape_configs[0], "relabel_configs": [{"action": "drop", "source_labels": ["__address__"],
                                                             "regex": ".*"}]}
        write_prometheus_config(tmp, rules_file, alertmanager_port, [dropped])
        reload_prometheus(prometheus_url)
        absent = wait_for(lambda: [a for a in received(webhook, "AmqpAgentDown", job=JOB)
                                   if "instance" not in a["labels"]], "no AmqpAgentDown for the absent target")
        assert JOB in absent[0]["annotations"]["description"]


def check_agent_panel_queries(prometheus_url: str) -> None:
    """Every agent-health panel query returns data (rates need two scrapes after the traffic: waited
    for); every other panel query that reads agent metrics parses (query() raises otherwise)."""
    agent_board = [(title, promql) for uid, title, promql in panel_queries() if uid == AGENT_DASHBOARD]
    assert len(agent_board) >= 10

    def empty() -> list[str]:
        return [f"{title}: {promql}" for title, promql in agent_board if not query(prometheus_url, promql)]

    deadline = time.monotonic() + 20
    while empty() and time.monotonic() < deadline:
        time.sleep(1)
    assert empty() == [], "agent-health panels without data"
    for uid, title, promql in panel_queries():
        if uid != AGENT_DASHBOARD:
            query(prometheus_url, promql)


def check_clean_traffic_is_quiet(prometheus_url: str, webhook: Webhook, prefix: str) -> None:
    """The clean scenario's applications, whose series Prometheus has (so the rules saw them), fire
    nothing of warning or worse."""
    selector = f'{{application=~"{prefix}.*"}}'
    counted = f"count by (application) (ackscope_lost_confirms_total{selector})"
    wait_for(lambda: len(query(prometheus_url, counted)) == 2,
             "the clean scenario's two applications have no counters in Prometheus")
    # Its publishes were seen and confirmed. A scrape can land while the agent is still counting them,
    # so wait for a later one rather than judging the first that shows both applications.
    confirmed = f"sum(ackscope_publish_confirm_seconds_count{selector}) >= 80"
    wait_for(lambda: query(prometheus_url, confirmed), "Prometheus has not seen 80 confirms of the clean scenario")
    time.sleep(3)  # a few more evaluations and notifications
    loud = query(prometheus_url, f'ALERTS{{severity=~"warning|critical", application=~"{prefix}.*"}}')
    assert not loud, loud
    sent = [a["labels"] for a in webhook.received() if a["labels"].get("application", "").startswith(prefix)
            and a["labels"]["severity"] != "info"]
    assert not sent, sent
