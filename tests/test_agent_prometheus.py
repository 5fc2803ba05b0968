"""A real Prometheus (Debian's package) scrapes the agent, and a rule over the live gauges evaluates:
a recording rule and an alert on the unacked deliveries a stuck consumer holds."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
import urllib.parse
import urllib.request

import pytest

from tests.agent_support import AgentProcess, free_port, publish_confirmed, wait_for

pytestmark = pytest.mark.rabbitmq

APP = "agent-test-prometheus"
RULES = textwrap.dedent("""\
    groups:
      - name: ackscope-agent-test
        interval: 1s
        rules:
          - record: application:ackscope_unacked_deliveries:sum
            expr: sum by (vhost, application) (ackscope_unacked_deliveries)
          - alert: AmqpDeliveriesHeldUnacked
            expr: ackscope_unacked_deliveries > 0 and on (vhost, application) ackscope_oldest_unacked_seconds > 1
            labels: {severity: warning}
            annotations:
              summary: "{{ $labels.application }} holds unacked deliveries"
    """)


@pytest.fixture
def prometheus(tmp_path):
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    assert binary and promtool, "prometheus is not installed: deploy/ci/services.sh installs it"

    def start(target_port: int) -> str:
        (tmp_path / "rules.yml").write_text(RULES)
        subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")], check=True, capture_output=True)
        (tmp_path / "prometheus.yml").write_text(textwrap.dedent(f"""\
            global: {{scrape_interval: 1s, evaluation_interval: 1s}}
            rule_files: [{tmp_path / 'rules.yml'}]
            scrape_configs:
              - job_name: ackscope-agent
                static_configs: [{{targets: ['127.0.0.1:{target_port}']}}]
            """))
        port = free_port()
        process = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(process)
        return f"http://127.0.0.1:{port}"

    started = []
    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def _api(base: str, path: str, **params):
    try:
        with urllib.request.urlopen(f"{base}{path}?{urllib.parse.urlencode(params)}", timeout=5) as reply:
            return json.loads(reply.read())["data"]
    except OSError:
        return None


def test_prometheus_scrapes_the_agent_and_a_rule_over_the_live_gauges_fires(tmp_path, prometheus):
    with AgentProcess(str(tmp_path / "lake"), agent_id="scraped") as agent:
        base = prometheus(agent.port)
        connection = publish_confirmed(APP, 7, close=False)
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        publish_channel = connection.channel()
        for number in range(7):
            publish_channel.basic_publish("", queue, b"held %d" % number)
        channel.basic_consume(queue, lambda *delivery: None, auto_ack=False)  # never acks

        def recorded():
            connection.process_data_events(time_limit=0.1)
            data = _api(base, "/api/v1/query", query=f'application:ackscope_unacked_deliveries:sum{{application="{APP}"}}')
            return data and data["result"] and float(data["result"][0]["value"][1])

        assert wait_for(recorded, timeout=60) == 7

        def firing():
            connection.process_data_events(time_limit=0.1)
            data = _api(base, "/api/v1/alerts")
            return data and [a for a in data["alerts"] if a["labels"].get("application") == APP and a["state"] == "firing"]

        alerts = wait_for(firing, timeout=60)
        assert alerts and alerts[0]["labels"]["alertname"] == "AmqpDeliveriesHeldUnacked"
        targets = _api(base, "/api/v1/targets")
        assert targets["activeTargets"][0]["health"] == "up"
        connection.close()
        # The channel closed: its series is gone from the agent at the next scrape.
        assert wait_for(lambda: agent.value("ackscope_unacked_deliveries", application=APP) == 0
                        and not [s for s in agent.samples() if s[1].get("application") == APP
                                 and s[0] == "ackscope_unacked_deliveries"])
        agent.stop()
