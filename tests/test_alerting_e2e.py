"""End to end with the real parts: every recorded example, ingested and analysed (the session's
`analysed_examples` lake), pushed by `ackscope push` to a real Pushgateway; a real Prometheus scrapes
it (and an agent target that is down) with the generated rules at lab scale; a real Alertmanager
sends what fires to a webhook this test serves.

Checks: the alert of every pathology the examples' expected.json files name fires for that
scenario's application (connection_name lab-<scenario>-...), with a description naming where; the
clean scenarios' applications fire nothing of warning or worse; the recording rules over the pushed
analysis return data; and every dashboard panel query (dashboards.grafana.panel_queries) parses and,
unless it reads only the live agent's metrics (no agent runs here: test_agent_alerting_e2e.py runs
one), returns data.

Intervals are a second and every `for` is 0 here (its both sides are promtool's job, test_rules.py),
so the whole chain settles in seconds.
"""

from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import dataclass

import pytest

from analyzer import cli, metric_names
from dashboards import rules
from dashboards.alert_settings import AlertSettings

from .findings_check import LAB_THRESHOLDS
from .prometheus_stack import Webhook, alertmanager, free_port, get_json, prometheus, pushgateway, query, settle

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# The lab's captures last seconds: its "too old" is a second, and nothing waits for a `for`.
LAB_SETTINGS = AlertSettings.from_pairs(
    [f"{name}=0" for name in AlertSettings.names() if name.endswith("_for_seconds")]
    + [f"oldest_unacked_seconds={LAB_THRESHOLDS.unacked_age_seconds}"])
AGENT_JOB = LAB_SETTINGS.agent_job
SETTLE_SECONDS = 90


@dataclass
class Stack:
    prometheus: str
    alertmanager: str
    pushgateway: str
    webhook: Webhook


@pytest.fixture(scope="module")
def stack(analysed_examples, tmp_path_factory):
    lake_dir, _ = analysed_examples
    tmp = str(tmp_path_factory.mktemp("alerting-e2e"))
    rules_file = os.path.join(tmp, "ackscope.rules.yml")
    with open(rules_file, "w") as out:
        out.write(rules.rules_yaml(LAB_SETTINGS))
    webhook = Webhook()
    closed_port = free_port()
    with pushgateway(tmp) as gateway, alertmanager(tmp, webhook) as (alertmanager_url, alertmanager_port):
        scrape_configs = [
            # honor_labels: the pushed job and lake labels are the group's, not the scrape's.
            {"job_name": "pushgateway", "honor_labels": True,
             "static_configs": [{"targets": [gateway.removeprefix("http://")]}]},
            # An agent target nobody listens on: AmqpAgentDown must say so.
            {"job_name": AGENT_JOB, "static_configs": [{"targets": [f"127.0.0.1:{closed_port}"]}]},
        ]
        with prometheus(tmp, rules_file, alertmanager_port, scrape_configs) as prometheus_url:
            assert cli.main(["push", "--lake", lake_dir, "--pushgateway", gateway]) == 0
            yield Stack(prometheus_url, alertmanager_url, gateway, webhook)


def expectations() -> list[dict]:
    return [json.load(open(path)) for path in sorted(glob.glob(os.path.join(EXAMPLES, "*.expected.json")))]


def pathologies() -> set[tuple[str, str]]:
    """(alert, application) for every kind the examples expect that raises an alert."""
    of_kind = rules.alerts_of_kind(LAB_SETTINGS)
    wanted = set()
    for expected in expectations():
        for entry in expected["expect"]:
            if entry["kind"] not in of_kind:  # info kinds the dashboards show and nothing pages for
                assert rules._KIND_SEVERITY[entry["kind"]] == "info", entry["kind"]
                continue
            wanted |= {(alert, entry["connection_name"]) for alert in of_kind[entry["kind"]]}
    return wanted


def clean_applications() -> set[str]:
    return {name for expected in expectations() if not expected["expect"]
            for name in expected["facts"]["connections"]}


def wait_for(condition, what: str, timeout: float = SETTLE_SECONDS):
    return settle(condition, what, timeout)


def test_every_pathology_in_the_examples_reaches_alertmanager(stack):
    wanted = pathologies()
    assert len(wanted) >= 10  # the examples hold eight alerting kinds, some on several applications

    def missing() -> list:
        got = {(a["labels"]["alertname"], a["labels"].get("application")) for a in stack.webhook.received()}
        return sorted(wanted - got)

    started = time.monotonic()
    deadline = started + SETTLE_SECONDS
    while missing() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not missing(), f"never reached the webhook: {missing()}"
    print(f"every pathology alert reached the webhook {time.monotonic() - started:.1f}s after the push")
    for alert in stack.webhook.received():
        labels, annotations = alert["labels"], alert["annotations"]
        if (labels["alertname"], labels.get("application")) in wanted:
            assert labels["application"] in annotations["description"]
            assert f"vhost {labels['vhost']}" in annotations["description"]
            assert annotations["runbook_url"].startswith(AlertSettings().runbook_url + "#")


def test_the_clean_scenarios_fire_nothing_of_warning_or_worse(stack):
    clean = clean_applications()
    assert {"lab-clean_async_confirms-publisher", "lab-clean_async_confirms-consumer"} <= clean
    # Wait until the rules have seen the pushed analysis: the findings' recording rule has data.
    wait_for(lambda: query(stack.prometheus, "ackscope:findings:sum"), "no recorded findings")
    time.sleep(3)  # a few more evaluations and notifications
    # Their series are there (so the rules did see them), just quiet.
    present = {r["metric"]["application"] for r in query(
        stack.prometheus, 'count by (application) ({__name__=~"ackscope_analysis_.+", application!=""})')}
    assert {"lab-clean_async_confirms-publisher", "lab-clean_async_confirms-consumer",
            "lab-channel_reuse-client", "lab-transactions-tx-consumer"} <= present, sorted(present)
    loud = [r["metric"] for r in query(stack.prometheus, 'ALERTS{severity=~"warning|critical"}')
            if r["metric"].get("application") in clean]
    assert not loud, loud
    sent = [a["labels"] for a in stack.webhook.received()
            if a["labels"].get("application") in clean and a["labels"]["severity"] != "info"]
    assert not sent, sent


def test_a_down_agent_target_fires_agent_down(stack):
    wait_for(lambda: [a for a in stack.webhook.received() if a["labels"]["alertname"] == "AmqpAgentDown"],
             "AmqpAgentDown never reached the webhook")
    firing = get_json(stack.alertmanager + "/api/v2/alerts")
    assert any(a["labels"]["alertname"] == "AmqpAgentDown" and a["labels"]["job"] == AGENT_JOB for a in firing)


def test_the_recording_rules_over_the_analysis_return_data(stack):
    for record in ("ackscope:findings:sum", "ackscope:analysis_publish_confirm_seconds:p99",
                   "ackscope:analysis_deliver_ack_seconds:p99", "ackscope:analysis:age_seconds"):
        wait_for(lambda: query(stack.prometheus, record), f"{record} has no data")
    kinds = {r["metric"]["kind"] for r in query(stack.prometheus, "ackscope:findings:sum")}
    assert {"lost_confirm", "requeue_loop", "flow_blocked"} <= kinds


def _reads_only_the_agent(promql: str) -> bool:
    """True when every metric the query reads comes from the live agent (directly or through a
    recording rule over agent metrics): no agent runs in this test, so no data is right for it."""
    from dashboards.grafana.promql import metric_names_in

    recorded = {r.record: r.expr for r in rules.recording_rules()}

    def sources(name: str) -> set[str]:
        if name in recorded:
            return {s for inner in metric_names_in(recorded[name]) for s in sources(inner)}
        return {metric_names.EXPOSED[name].source}

    names = metric_names_in(promql)
    return bool(names) and all(sources(name) == {metric_names.AGENT} for name in names)


def check_panel_queries(prometheus_url: str, queries: list[tuple[str, str, str]]) -> list[str]:
    """Runs every (dashboard uid, panel title, PromQL) against Prometheus: each must parse (query()
    raises with Prometheus' error), and return data unless it reads only agent metrics. Returns the
    panels left without data for want of an agent."""
    waiting_for_agent = []
    for uid, title, promql in queries:
        result = query(prometheus_url, promql)
        if result:
            continue
        assert _reads_only_the_agent(promql), f"{uid} / {title}: no data from {promql}"
        waiting_for_agent.append(f"{uid} / {title}")
    return waiting_for_agent


def test_every_dashboard_panel_query_parses_and_returns_data(stack):
    from dashboards.grafana import panel_queries

    queries = panel_queries()
    assert queries
    wait_for(lambda: query(stack.prometheus, "ackscope:findings:sum"), "no recorded findings")
    agent_only = check_panel_queries(stack.prometheus, queries)
    assert len(agent_only) < len(queries)
    print(f"{len(queries)} panel queries: {len(queries) - len(agent_only)} with data, "
          f"{len(agent_only)} read only the agent's metrics (no agent in this test)")
