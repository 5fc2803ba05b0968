"""The metric catalog (analyzer/metric_names.py) follows Prometheus' naming conventions and the
label rules of DESIGN.md; the label helpers fold what exceeds the cap."""

import re

import pytest

from analyzer import labels, metric_names as m

FORBIDDEN_LABELS = {"connection_id", "connection", "port", "channel", "delivery_tag", "tag", "message_id", "seq"}


@pytest.mark.parametrize("metric", m.METRICS, ids=lambda x: x.name)
def test_names_follow_prometheus_conventions(metric):
    assert re.fullmatch(r"ackscope_[a-z][a-z0-9_]*", metric.name) or metric.name in m.STANDARD_PROCESS
    assert metric.name.endswith("_total") == (metric.type == m.COUNTER)
    if metric.source == m.ANALYSIS:
        assert metric.type != m.COUNTER, "a push replaces the group: nothing pushed accumulates"
    if "seconds" in metric.name:
        assert metric.name.endswith(("_seconds", "_seconds_total")), "the unit ends the name"
    assert not FORBIDDEN_LABELS & set(metric.labels)
    assert metric.help.endswith(".")


def test_names_are_unique_and_series_names_do_not_collide():
    assert len(m.BY_NAME) == len(m.METRICS)
    assert len(m.EXPOSED) == sum(len(m.exposed_names(x)) for x in m.METRICS)


def test_application_label():
    assert labels.application("orders-api", "pika", "10.0.0.7") == "orders-api"
    assert labels.application(None, "pika", "10.0.0.7") == "pika@10.0.0.7"
    assert labels.application("", "pika", None) == "pika"
    assert labels.application(None, None, "10.0.0.7") == "unknown"


def test_the_cap_folds_new_applications_into_other_and_counts_them():
    cap = labels.ApplicationCap(limit=2)
    assert [cap.label(a, "x") for a in ("a", "b", "a", "c", "d", "b")] == ["a", "b", "a", "other", "other", "b"]
    assert cap.folded == {"x": 2}
    with pytest.raises(ValueError):
        labels.ApplicationCap(limit=0)
