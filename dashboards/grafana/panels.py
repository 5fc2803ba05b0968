"""The few panel shapes every ackscope dashboard is made of, so each panel function says only what is
its own: title, what it means and what to do, the query, the unit."""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, common as common_builder, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common, prometheus as prometheus_model, units
from grafana_foundation_sdk.models.dashboard import (DynamicConfigValue, Threshold, ThresholdsMode, ValueMap,
                                                     ValueMappingResult)

# Every panel reads the Prometheus the dashboard's `datasource` variable points at, so one JSON file
# works against any Grafana whatever its data source is called.
DATASOURCE = common.DataSourceRef(type_val="prometheus", uid="${datasource}")

SECONDS = units.Seconds
COUNT = units.Short
PER_SECOND = units.Short   # with "per second" in the title: Grafana's ops/s reads as operations
PACKETS_PER_SECOND = units.PacketsPerSecond
BYTES_PER_SECOND = units.BytesPerSecondSI
BYTES = units.BytesIEC


def query(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(DATASOURCE)


def instant(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
    return query(expr, legend, ref).instant()


def table_query(expr: str, ref: str = "A") -> prometheus.Dataquery:
    return query(expr, ref=ref).instant().format(prometheus_model.PromQueryFormat.TABLE)


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Colour steps, the first from -infinity (value None)."""
    return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
        [Threshold(value=value, color=color) for value, color in steps])


ANY_IS_BAD = thresholds((None, "green"), (1, "red"))
SEVERITY_COLOURS = {"critical": "red", "warning": "orange", "info": "blue"}


def coloured_by_severity(panel):
    """Series named "<severity>: ..." (legend) take their severity's colour: info is not an alarm."""
    for severity, colour in SEVERITY_COLOURS.items():
        panel = panel.override_by_regexp(f"^{severity}:.*", [DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": colour})])
    return panel


def yes_no(panel, yes: str, no: str):
    """A 0/1 value shown as words."""
    return panel.mappings([ValueMap(options={"0": ValueMappingResult(text=no, color="green", index=0),
                                             "1": ValueMappingResult(text=yes, color="red", index=1)})])


def timeseries_panel(title: str, description: str, unit: str, *targets: prometheus.Dataquery,
                     width: int = 12, height: int = 8) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
             .unit(unit).min(0).span(width).height(height).fill_opacity(10).line_width(1)
             .show_points(common.VisibilityMode.NEVER)
             .legend(common_builder.VizLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
             .tooltip(common_builder.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI)
                      .sort(common.SortOrder.DESCENDING)))
    for target in targets:
        panel = panel.with_target(target)
    return panel


def stat_panel(title: str, description: str, unit: str, target: prometheus.Dataquery,
               colours: dashboard.ThresholdsConfig = ANY_IS_BAD, width: int = 4, height: int = 4) -> stat.Panel:
    return (stat.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
            .span(width).height(height).with_target(target).thresholds(colours)
            .color_mode(common.BigValueColorMode.BACKGROUND).graph_mode(common.BigValueGraphMode.NONE)
            .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"])))


def bars_panel(title: str, description: str, unit: str, *targets: prometheus.Dataquery,
               colours: dashboard.ThresholdsConfig = ANY_IS_BAD, width: int = 12, height: int = 8) -> bargauge.Panel:
    panel = (bargauge.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
             .span(width).height(height).thresholds(colours).min(0)
             .orientation(common.VizOrientation.HORIZONTAL).display_mode(common.BarGaugeDisplayMode.BASIC)
             .reduce_options(common_builder.ReduceDataOptions().calcs(["lastNotNull"])))
    for target in targets:
        panel = panel.with_target(target)
    return panel


def table_panel(title: str, description: str, unit: str, target: prometheus.Dataquery,
                width: int = 12, height: int = 8) -> table.Panel:
    return (table.Panel().title(title).description(description).datasource(DATASOURCE).unit(unit)
            .span(width).height(height).with_target(target))
