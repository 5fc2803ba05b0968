"""The generated Prometheus rules: up to date with dashboards/rules.py, valid for promtool, right on
both sides of every threshold and `for` (promtool test rules), using only catalogued metric names,
each alert with its runbook section."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from analyzer import metric_names
from dashboards import rules
from dashboards.alert_settings import AlertSettings
from dashboards.grafana.promql import metric_names_in
from dashboards.grafana.recorded import RECORDING_RULES

from .prometheus_stack import binary
from .promtool_cases import promtool_tests

# Names the dashboards helper relies on: renaming one breaks panels.
RECORDINGS = {
    "ackscope:findings:sum": "sum by (kind, severity) (ackscope_findings)",
    "ackscope:publish_confirm_seconds:p99_5m":
        "histogram_quantile(0.99, sum by (le, vhost, application) (rate(ackscope_publish_confirm_seconds_bucket[5m])))",
    "ackscope:deliver_ack_seconds:p99_5m":
        "histogram_quantile(0.99, sum by (le, vhost, application) (rate(ackscope_deliver_ack_seconds_bucket[5m])))",
    "ackscope:requeues:rate5m": "sum by (vhost, application) (rate(ackscope_requeues_total[5m]))",
    "ackscope:redeliveries:rate5m": "sum by (vhost, application) (rate(ackscope_redeliveries_total[5m]))",
    "ackscope:lost_confirms:increase1h": "sum by (vhost, application) (increase(ackscope_lost_confirms_total[1h]))",
}
RUNBOOK = rules.os.path.join(rules.os.path.dirname(rules.OUTPUT), "..", "..", "RUNBOOK.md")


def test_the_committed_rules_file_is_generated_from_rules_py():
    with open(rules.OUTPUT) as committed:
        assert committed.read() == rules.rules_yaml(), "stale: run `python -m dashboards.rules` and commit the file"


def test_promtool_check_rules():
    run = subprocess.run([binary("promtool"), "check", "rules", rules.OUTPUT], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_promtool_unit_tests_on_both_sides_of_every_threshold_and_for(tmp_path):
    document = promtool_tests(rules.OUTPUT, AlertSettings())
    signals = sum(len(a.signals) for a in rules.alerts(AlertSettings()))
    assert len(document["tests"]) == 2 * signals
    path = tmp_path / "ackscope.rules.test.yml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    run = subprocess.run([binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]


def test_the_unit_tests_catch_a_wrong_threshold(tmp_path):
    """The generated tests fail on rules whose threshold moved: they test something."""
    moved = tmp_path / "moved.rules.yml"
    moved.write_text(rules.rules_yaml(AlertSettings(unacked_deliveries=5000, requeues_per_second=10.0)))
    path = tmp_path / "moved.test.yml"
    path.write_text(yaml.safe_dump(promtool_tests(str(moved), AlertSettings()), sort_keys=False))
    run = subprocess.run([binary("promtool"), "test", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode != 0
    assert "AmqpUnackedBuildup" in run.stdout + run.stderr and "AmqpRequeueLoop" in run.stdout + run.stderr


def test_recording_rules_the_dashboards_use():
    recorded = {r.record: r.expr for r in rules.recording_rules()}
    for name, expr in RECORDINGS.items():
        assert recorded.get(name) == expr
    for name, by in RECORDING_RULES.items():  # what the panels read (dashboards/grafana/recorded.py)
        assert f"by ({', '.join(by)})" in recorded[name] or f"by (le, {', '.join(by)})" in recorded[name], name


def test_every_metric_in_the_rules_is_catalogued_or_recorded():
    document = rules.rules_document()
    recorded = {r["record"] for group in document["groups"] for r in group["rules"] if "record" in r}
    known = set(metric_names.EXPOSED) | recorded | {"up"}
    used = set()
    for group in document["groups"]:
        for rule in group["rules"]:
            names = metric_names_in(rule["expr"])
            assert names, rule
            assert names <= known, f"{rule.get('alert') or rule.get('record')}: {sorted(names - known)}"
            used |= names
    assert "ackscope_findings" in used and "ackscope_unacked_deliveries" in used


def test_alerts_follow_the_mixin_conventions_and_have_a_runbook_section():
    with open(RUNBOOK) as runbook:
        anchors = {re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
                   for line in runbook if line.startswith("## ")}
    for alert in rules.alerts(AlertSettings()):
        assert re.fullmatch(r"Amqp[A-Z][A-Za-z]+", alert.name)
        assert alert.severity in ("critical", "warning", "info")
        assert alert.runbook in anchors, f"RUNBOOK.md has no section for {alert.name}"
        assert "$labels" in alert.description
    names = [a.name for a in rules.alerts(AlertSettings())]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("pair, error", [
    ("unacked_deliveries=0", "must be > 0"), ("agent_down_for_seconds=-1", ">= 0"),
    ("agent_down_for_seconds=1.5", "needs a int"), ("nonsense=1", "expected name=value"),
    ('agent_job=a"b', "plain job name")])
def test_settings_are_validated(pair, error):
    with pytest.raises(ValueError, match=error):
        AlertSettings.from_pairs([pair])


def test_generator_writes_other_settings(tmp_path):
    out = tmp_path / "lab.rules.yml"
    assert rules.main(["-o", str(out), "--set", "unacked_deliveries=50", "--set", "agent_down_for_seconds=60"]) == 0
    text = out.read_text()
    assert "> 50)" in text and "for: 1m" in text and "# Settings: unacked_deliveries=50" in text
