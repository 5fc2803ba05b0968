"""The dashboards' template variables. vhost and application are read from the labels of the
catalog's metrics (analyzer/metric_names.py), agent and analysis alike, so the drill-down lists the
same names whether a site runs the live agent, the scheduled analysis, or both."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.models.dashboard import VariableOption, VariableRefresh, VariableSort

from analyzer import metric_names

from .panels import DATASOURCE

# Grafana puts this in place of a variable when "All" is selected; promql.SUBSTITUTIONS does the same.
ALL = ".*"


def datasource() -> dashboard.DatasourceVariable:
    return dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")


def catalog_selector(label: str, extra: str = "") -> str:
    """A series selector for every catalog series that carries `label`."""
    names = sorted(series for series, metric in metric_names.EXPOSED.items() if label in metric.labels)
    return '{__name__=~"' + "|".join(names) + '"' + (", " + extra if extra else "") + "}"


def _label_variable(name: str, label: str, query: str) -> dashboard.QueryVariable:
    return (dashboard.QueryVariable(name).label(label).query(query).datasource(DATASOURCE)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(ALL)
            .current(VariableOption(selected=True, text="All", value="$__all")))


def vhost() -> dashboard.QueryVariable:
    return _label_variable("vhost", "vhost", f"label_values({catalog_selector('vhost')}, vhost)")


def application() -> dashboard.QueryVariable:
    selector = catalog_selector("application", 'vhost=~"$vhost"')
    return _label_variable("application", "application", f"label_values({selector}, application)")


def agent_instance() -> dashboard.QueryVariable:
    """The agents Prometheus scrapes (its `instance` target label)."""
    return _label_variable("instance", "agent", "label_values(ackscope_agent_packets_total, instance)")


def variable_selectors(dashboard_json: dict) -> list[str]:
    """The series selectors inside the label_values() queries of a built dashboard's variables."""
    selectors = []
    for variable in dashboard_json.get("templating", {}).get("list", []):
        text = variable.get("query")
        if variable.get("type") == "query" and isinstance(text, str) and text.startswith("label_values("):
            selectors.append(text[len("label_values("):text.rindex(",")])
    return selectors
