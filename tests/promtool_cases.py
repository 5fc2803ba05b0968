"""promtool unit tests built from the rules' own data (dashboards/rules.py): for every signal of every
alert, its firing input checked one evaluation before it starts to hold and before its `for` ends
(nothing yet) and one after (the alert, with its labels and rendered annotations), and its quiet
input, just on the other side of the threshold, checked to fire nothing even after the `for`."""

from __future__ import annotations

from dashboards.alert_settings import AlertSettings
from dashboards.rules import TEST_STEPS, Alert, alerts, render, rules_document

STEP = 60  # seconds between input samples and between evaluations


def _minutes(seconds: int) -> str:
    return f"{seconds // STEP}m"


def _inputs(series: tuple) -> list[dict]:
    return [{"series": s.selector, "values": s.values} for s in series]


def alert_cases(alert: Alert, settings: AlertSettings) -> list[dict]:
    for_seconds = getattr(settings, alert.for_setting)
    assert for_seconds % STEP == 0, f"{alert.name}: the tests evaluate once a minute"
    cases = []
    for number, signal in enumerate(alert.signals, 1):
        # A condition holds from the first evaluation (gauges) or the second (a counter needs two
        # samples), or from the minute its input says (a series born later).
        fires_by = signal.starts_at + for_seconds + STEP
        assert fires_by + 30 * STEP < TEST_STEPS * STEP
        labels = {**signal.labels, "severity": alert.severity}
        expected = {"exp_labels": labels,
                    "exp_annotations": {"summary": render(alert.summary, labels),
                                        "description": render(alert.description, labels),
                                        "runbook_url": f"{settings.runbook_url}#{alert.runbook}"}}
        checks = []
        if signal.starts_at:
            checks.append({"eval_time": _minutes(signal.starts_at - STEP), "alertname": alert.name, "exp_alerts": []})
        if for_seconds:
            checks.append({"eval_time": _minutes(signal.starts_at + for_seconds - STEP), "alertname": alert.name,
                           "exp_alerts": []})
        checks.append({"eval_time": _minutes(fires_by), "alertname": alert.name, "exp_alerts": [expected]})
        cases.append({"name": f"{alert.name} signal {number} fires after its for ({_minutes(for_seconds)})",
                      "interval": "1m", "input_series": _inputs(signal.firing), "alert_rule_test": checks})
        cases.append({"name": f"{alert.name} signal {number} stays quiet on the other side of its threshold",
                      "interval": "1m", "input_series": _inputs(signal.quiet), "alert_rule_test": [
                          {"eval_time": _minutes(t), "alertname": alert.name, "exp_alerts": []}
                          for t in (STEP, fires_by, fires_by + 30 * STEP)]})
    return cases


def promtool_tests(rules_file: str, settings: AlertSettings) -> dict:
    """The promtool test document for the rules in `rules_file`, generated with these settings."""
    tests = [case for alert in alerts(settings) for case in alert_cases(alert, settings)]
    # promtool evaluates the groups in random order unless told: recordings first, as alerts read them.
    return {"rule_files": [rules_file], "evaluation_interval": "1m",
            "group_eval_order": [group["name"] for group in rules_document(settings)["groups"]], "tests": tests}
