"""The Grafana dashboard's structure: what Grafana needs to import it and draw every panel
(schema version, unique panel ids, panels that do not overlap on the grid, one Prometheus
datasource variable every panel and query uses) and the template variables for pool, model,
replica and SLO; `servewatch grafana` writes it and summarises it. That every query returns
servewatch's numbers from a real Prometheus is tests/test_grafana_prometheus.py."""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.dashboards.grafana import (
    DashboardLabelError,
    DashboardLabels,
    build_grafana_dashboard,
    dashboard_panels,
)
from servewatch.dashboards.grafana_panel import PANELS, PanelRow

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return build_grafana_dashboard()


def _cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    grid = panel["gridPos"]
    return {
        (x, y)
        for x in range(grid["x"], grid["x"] + grid["w"])
        for y in range(grid["y"], grid["y"] + grid["h"])
    }


def test_the_schema_version_is_one_grafana_11_reads(document: dict[str, Any]) -> None:
    assert isinstance(document["schemaVersion"], int)
    assert 36 <= document["schemaVersion"] <= 41
    assert document["uid"] == "servewatch-fleet"


def test_panel_ids_are_unique_and_every_panel_is_placed_on_the_grid_without_overlap(
    document: dict[str, Any],
) -> None:
    panels = document["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), ids
    assert all(isinstance(i, int) and i > 0 for i in ids)
    for panel in panels:
        grid = panel["gridPos"]
        assert min(grid["w"], grid["h"]) > 0, panel["title"]
        assert grid["x"] >= 0, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    for a, b in combinations(panels, 2):
        assert not _cells(a) & _cells(b), (a["title"], b["title"])


def test_rows_come_in_order_and_hold_the_panels_defined_for_them(document: dict[str, Any]) -> None:
    rows = [p for p in document["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == [row.value for row in PanelRow]
    # Each row is followed by its own panels, in their definition order.
    titles = [p["title"] for p in document["panels"]]
    for row in PanelRow:
        start = titles.index(row.value)
        mine = [p.title for p in PANELS if p.row is row]
        assert titles[start + 1 : start + 1 + len(mine)] == mine


def test_every_panel_and_query_reads_the_datasource_variable(document: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard_panels(document)
    assert len(panels) == len(PANELS)
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            # placeholders all filled: only Grafana's own variables remain
            leftover = re.findall(r"\$\{?(\w+)", target["expr"])
            assert set(leftover) <= {
                "pool",
                "model",
                "replica",
                "slo",
                "__rate_interval",
                "__range",
            }
            assert "{vllm}" not in target["expr"]
            assert "{replica" not in target["expr"]


@pytest.mark.parametrize(
    ("name", "query"),
    [
        ("pool", "label_values(vllm:num_requests_running, pool)"),
        ("model", 'label_values(vllm:num_requests_running{pool=~"$pool"}, model_name)'),
        (
            "replica",
            'label_values(vllm:num_requests_running{pool=~"$pool",model_name=~"$model"}, pod)',
        ),
        ("slo", "label_values(servewatch_slo_events_total, slo)"),
    ],
)
def test_template_variables_are_label_values_queries_with_an_all_option(
    document: dict[str, Any], name: str, query: str
) -> None:
    variable = next(v for v in document["templating"]["list"] if v["name"] == name)
    assert variable["type"] == "query"
    assert variable["query"] == query
    assert variable["datasource"] == DATASOURCE
    assert variable["multi"]
    assert variable["includeAll"]
    assert variable["allValue"] == ".*"


def test_dcgm_panels_join_gpus_to_the_selected_replicas_by_pod(document: dict[str, Any]) -> None:
    gpu = [p for p in PANELS if p.row is PanelRow.GPU]
    by_title = {p["title"]: p for p in dashboard_panels(document)}
    for panel in gpu:
        for target in by_title[panel.title]["targets"]:
            assert "and on (namespace, pod) group by (namespace, pod) (" in target["expr"]
            assert 'pod=~"$replica"' in target["expr"]


@pytest.mark.parametrize(
    ("labels", "join", "legend"),
    [
        (DashboardLabels(), "namespace, pod", "{{namespace}}/{{pod}}"),
        (DashboardLabels(replica="replica", namespace=""), "replica", "{{replica}}"),
    ],
)
def test_the_replica_labels_name_the_join_and_the_legends(
    labels: DashboardLabels, join: str, legend: str
) -> None:
    panels = {p["title"]: p for p in dashboard_panels(build_grafana_dashboard(labels=labels))}
    target = panels["GPU power"]["targets"][0]
    assert f"sum by ({join}) (" in target["expr"]
    assert f"and on ({join})" in target["expr"]
    assert target["legendFormat"] == legend


@pytest.mark.parametrize("bad", ["", "1pod", "pod-name", "pod name"])
def test_a_label_that_prometheus_cannot_hold_is_refused(bad: str) -> None:
    with pytest.raises(DashboardLabelError, match="not a Prometheus label name"):
        DashboardLabels(replica=bad)


def test_the_command_writes_the_dashboard_and_summarises_it(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.json"
    result = CliRunner().invoke(app, ["grafana", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written == build_grafana_dashboard()
    assert [p["title"] for p in summary["panels"]] == [p.title for p in PANELS]
    assert summary["queries"] == sum(len(p.queries) for p in PANELS)
    assert [v["name"] for v in summary["variables"]] == [
        "datasource",
        "pool",
        "model",
        "replica",
        "slo",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replica-label", "pod-name"], "not a Prometheus label name"),
        (["--out", "."], "is a folder"),
    ],
)
def test_the_command_refuses_bad_input_with_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["grafana", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
