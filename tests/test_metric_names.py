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


def test_the_cap_folds_new_values_into_other_and_counts_them():
    cap = labels.LabelCap("application", limit=2)
    assert [cap.label(a) for a in ("a", "b", "a", "c", "d", "b")] == ["a", "b", "a", "other", "other", "b"]
    assert cap.folds == 2
    with pytest.raises(ValueError):
        labels.LabelCap("application", limit=0)


def test_a_value_asked_for_without_admission_takes_no_slot():
    """A connection the broker has not accepted gets an admitted label or "other", never a slot."""
    cap = labels.LabelCap("vhost", limit=1)
    assert cap.label("refused", admit=False) == "other"
    assert cap.admitted == set() and cap.folds == 1
    assert cap.label("real") == "real"
    assert cap.label("real", admit=False) == "real"


def test_vhost_and_application_are_capped_apart_and_a_series_folded_by_either_counts_once():
    caps = labels.SeriesCaps(max_applications=2, max_vhosts=1)
    assert caps.where(("/", "a"), "m") == ("/", "a")
    assert caps.where(("/", "b"), "m") == ("/", "b")
    assert caps.where(("other-vhost", "c"), "m") == ("other", "other")
    assert caps.where(("/", "c"), "n") == ("/", "other")
    assert caps.folded == {"m": 1, "n": 1}
    assert caps.folds_by_label() == {"vhost": 1, "application": 2}


def test_label_values_are_cut_to_the_length_bound_with_a_marker_and_counted():
    huge = "x" * 100_000
    app, vhost = labels.application(huge, None, None), labels.vhost("v" * 5000)
    assert app == "x" * labels.MAX_LABEL_LENGTH + "...[+99,880 chars]"
    assert vhost.startswith("v" * labels.MAX_LABEL_LENGTH) and vhost.endswith("...[+4,880 chars]")
    assert labels.application("pika" * 100, None, None).endswith("...[+280 chars]")
    assert labels.application("x" * labels.MAX_LABEL_LENGTH, None, None) == "x" * labels.MAX_LABEL_LENGTH
    caps = labels.SeriesCaps()
    caps.where((vhost, app))
    caps.where((vhost, app))
    caps.where(("/", "short"))
    assert caps.truncations_by_label() == {"vhost": 1, "application": 1}


def test_help_texts_need_no_escape_in_either_exposition_format():
    """OpenMetrics escapes a quote in a HELP line (\\"), the Prometheus text format does not know that
    escape: promtool and Prometheus' text parser refuse the whole document."""
    for metric in m.METRICS:
        assert not set(metric.help) & {'"', "\\", "\n"}, metric.name
