"""The Grafana dashboard export: `grafana_panel.PANELS` built with grafana-foundation-sdk into
one dashboard JSON over the user's Prometheus, with a datasource variable and template
variables for pool, model, replica and SLO (Prometheus `label_values` queries).

Like the report, an export: a pure function from the panel definitions and the user's label
names to a JSON-ready dict; writing it is the caller's business.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model

from servewatch.dashboards.grafana_panel import (
    PANELS,
    REPLICA_LEGEND,
    GrafanaPanel,
    PanelKind,
    PanelRow,
)

DATASOURCE_VARIABLE = "datasource"
ALL_VALUE = ".*"
# The series whose labels name the replicas, their pools and models.
REPLICA_SERIES = "vllm:num_requests_running"
SLO_SERIES = "servewatch_slo_events_total"
_LABEL_NAME = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"


class DashboardLabelError(ValueError):
    """A label name given for the dashboard is not a Prometheus label name."""


@dataclass(frozen=True)
class DashboardLabels:
    """The label names of the user's Prometheus the dashboard selects and joins by.

    `replica` names a replica on its vLLM series and on the dcgm-exporter series of its GPUs
    (dcgm-exporter's Kubernetes mapping writes `pod` and `namespace`); `namespace` qualifies it
    (empty: replica names are unique on their own). vLLM targets need a `pool` target label,
    as servewatch's pool gauges have; `model_name` is vLLM's own label.
    """

    replica: str = "pod"
    namespace: str = "namespace"

    def __post_init__(self) -> None:
        for field, value in (("replica", self.replica), ("namespace", self.namespace)):
            if field == "namespace" and value == "":
                continue
            if value[:1].isdigit() or not value or any(c not in _LABEL_NAME for c in value):
                raise DashboardLabelError(
                    f"{field} label {value!r} is not a Prometheus label name: letters, digits "
                    "and '_', not starting with a digit"
                )

    @property
    def replica_labels(self) -> tuple[str, ...]:
        """The labels that name one replica, namespace first."""
        return (self.namespace, self.replica) if self.namespace else (self.replica,)

    def placeholders(self) -> dict[str, str]:
        """What the panel queries' placeholders stand for (`grafana_panel`)."""
        vllm = f'pool=~"$pool",model_name=~"$model",{self.replica}=~"$replica"'
        replica = ", ".join(self.replica_labels)
        return {
            "vllm": vllm,
            "replica": replica,
            "replicas": f"group by ({replica}) ({REPLICA_SERIES}{{{vllm}}})",
            "pool": 'pool=~"$pool"',
            "slo": 'slo=~"$slo"',
        }

    @property
    def replica_legend(self) -> str:
        return "/".join(f"{{{{{label}}}}}" for label in self.replica_labels)


def panel_exprs(panel: GrafanaPanel, labels: DashboardLabels) -> list[str]:
    """The panel's queries as the dashboard holds them (placeholders filled)."""
    values = labels.placeholders()
    return [query.expr.format(**values) for query in panel.queries]


def _datasource() -> model.DataSourceRef:
    return model.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")


def _variable(name: str, label: str, query: str, description: str) -> board.QueryVariable:
    return (
        board.QueryVariable(name)
        .label(label)
        .description(description)
        .query(query)
        .datasource(_datasource())
        .multi(True)
        .include_all(True)
        .all_value(ALL_VALUE)
        .current(model.VariableOption(selected=True, text="All", value="$__all"))
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.NATURAL_ASC)
    )


def _variables(labels: DashboardLabels) -> list[Builder[model.VariableModel]]:
    pool_filter = 'pool=~"$pool"'
    model_filter = f'{pool_filter},model_name=~"$model"'
    return [
        board.DatasourceVariable(DATASOURCE_VARIABLE).label("Prometheus").type("prometheus"),
        _variable(
            "pool",
            "pool",
            f"label_values({REPLICA_SERIES}, pool)",
            "Pools of replicas (the vLLM targets' pool label).",
        ),
        _variable(
            "model",
            "model",
            f"label_values({REPLICA_SERIES}{{{pool_filter}}}, model_name)",
            "Served models of the selected pools.",
        ),
        _variable(
            "replica",
            "replica",
            f"label_values({REPLICA_SERIES}{{{model_filter}}}, {labels.replica})",
            "Replicas of the selected pools and models; their GPUs are joined by "
            f"{' and '.join(labels.replica_labels)}.",
        ),
        _variable(
            "slo",
            "SLO",
            f"label_values({SLO_SERIES}, slo)",
            "SLOs servewatch evaluates (servewatch run's gauges).",
        ),
    ]


def _target(expr: str, legend: str, ref_id: str, kind: PanelKind) -> prometheus.Dataquery:
    query = (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .ref_id(ref_id)
        .datasource(_datasource())
    )
    if kind is PanelKind.HEATMAP:
        return query.format(prometheus_model.PromQueryFormat.HEATMAP).range()
    if kind is PanelKind.STAT:
        return query.instant()
    return query.range()


def _panel(panel: GrafanaPanel, panel_id: int, labels: DashboardLabels) -> Builder[model.Panel]:
    kinds: dict[PanelKind, type[Any]] = {
        PanelKind.TIMESERIES: timeseries.Panel,
        PanelKind.HEATMAP: heatmap.Panel,
        PanelKind.STAT: stat.Panel,
    }
    builder: Any = kinds[panel.kind]()
    built = (
        builder.id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .datasource(_datasource())
        .unit(panel.unit)
        .height(panel.height)
        .span(panel.width)
    )
    for index, (query, expr) in enumerate(
        zip(panel.queries, panel_exprs(panel, labels), strict=True)
    ):
        legend = labels.replica_legend if query.legend == REPLICA_LEGEND else query.legend
        built = built.with_target(_target(expr, legend, chr(ord("A") + index), panel.kind))
    result: Builder[model.Panel] = built
    return result


def build_grafana_dashboard(
    *,
    labels: DashboardLabels | None = None,
    title: str = "servewatch: vLLM fleet, GPUs, SLOs and capacity",
    uid: str = "servewatch-fleet",
    panels: Sequence[GrafanaPanel] = PANELS,
) -> dict[str, Any]:
    """The dashboard as a JSON-ready dict: one row per `PanelRow` (in its order) holding its
    panels, ids numbered from 1 in that order, over the `datasource` variable."""
    labels = labels or DashboardLabels()
    builder = (
        board.Dashboard(title)
        .uid(uid)
        .description(
            "Generated by `servewatch grafana`: vLLM's and dcgm-exporter's panels over this "
            "Prometheus, with servewatch's SLO, error budget, burn rate and capacity gauges."
        )
        .tags(["servewatch", "vllm", "dcgm", "slo"])
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("utc")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .variables(_variables(labels))
    )
    next_id = 1
    for row in PanelRow:
        members = [p for p in panels if p.row is row]
        if not members:
            continue
        builder = builder.with_row(board.Row(row.value).id(next_id))
        next_id += 1
        for panel in members:
            builder = builder.with_panel(_panel(panel, next_id, labels))
            next_id += 1
    document: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return document


def dashboard_panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels that draw data (rows left out), rows' nested panels included."""
    out: list[dict[str, Any]] = []
    for panel in document.get("panels", []):
        if panel.get("type") == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def dashboard_summary(document: dict[str, Any]) -> dict[str, Any]:
    """What a dashboard holds, for `servewatch grafana --json`: its panels with their queries,
    and its variables with their queries."""
    panels = dashboard_panels(document)
    return {
        "title": document.get("title"),
        "uid": document.get("uid"),
        "schema_version": document.get("schemaVersion"),
        "panels": [
            {
                "id": p.get("id"),
                "title": p.get("title"),
                "type": p.get("type"),
                "unit": p.get("fieldConfig", {}).get("defaults", {}).get("unit"),
                "queries": [t.get("expr") for t in p.get("targets", [])],
            }
            for p in panels
        ],
        "queries": sum(len(p.get("targets", [])) for p in panels),
        "variables": [
            {"name": v.get("name"), "type": v.get("type"), "query": v.get("query")}
            for v in document.get("templating", {}).get("list", [])
        ],
    }
