"""Small PromQL helpers: the selectors the panels share, turning a panel's templated expression into
one Prometheus can run, and listing the metric names an expression reads (for the catalog check)."""

from __future__ import annotations

import re

# What Grafana puts in place of each template variable when "All" is selected (the variables'
# allValue), and of the built-in interval; panel_queries() does the same so the very expressions
# the panels run can be tried against a real Prometheus.
SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$vhost": ".*",
    "$application": ".*",
    "$instance": ".*",
}

WHERE = 'vhost=~"$vhost", application=~"$application"'
AGENT = 'instance=~"$instance"'

_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
             "offset", "bool", "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:]|\s*\()")


def runnable(expr: str) -> str:
    """The expression with the dashboards' variables replaced as Grafana would with "All" selected."""
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace("${" + variable[1:] + "}", value).replace(variable, value)
    return expr


def metric_names_in(expr: str) -> set[str]:
    """The metric names an expression selects. Not a full parser: strings, label matchers, ranges
    and grouping clauses are cut out first, so what remains that is neither a function call nor a
    keyword is a metric name. Expressions must also pass Prometheus's own parser (tests do both)."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in _KEYWORDS}
