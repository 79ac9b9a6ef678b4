"""Sloth and OpenSLO files: what maps becomes servewatch specs, what does not is said."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from servewatch.slo.buckets import LatencyMetric
from servewatch.slo.fields import SpecError
from servewatch.slo.imports import (
    SloFormat,
    import_openslo,
    import_sloth,
    load_slo_file,
    recognize_sli,
)
from servewatch.slo.spec import AvailabilitySli, LatencySli, SliSource
from servewatch.slo.windows import Severity
from tests.conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "docs" / "examples" / "slo"


def test_sloth_example_maps_vllm_slos_and_says_what_does_not() -> None:
    loaded = load_slo_file(EXAMPLES / "sloth.yaml")
    assert loaded.format is SloFormat.SLOTH
    specs = {s.name: s for s in loaded.specs}
    assert set(specs) == {"chat-ttft", "chat-availability"}
    ttft = specs["chat-ttft"]
    assert ttft.sli == LatencySli(LatencyMetric.TTFT, 0.5, SliSource.METRICS)
    assert (ttft.objective_ratio, ttft.period) == (0.99, "30d")
    assert dict(ttft.scope) == {"model": "llama-3.1-70b"}
    assert dict(ttft.labels) == {"owner": "inference-team"}
    assert {w.severity for w in ttft.windows} == {Severity.PAGE}  # ticket_alert disabled
    assert specs["chat-availability"].sli == AvailabilitySli(SliSource.METRICS)
    assert specs["chat-availability"].objective_ratio == 0.999  # 99.9 %, not 0.9990000000000001
    notes = "\n".join(loaded.notes)
    assert "slos[2]: skipped; its queries count neither" in notes
    assert "matcher job='vllm' not kept" in notes
    assert "slos[0].alerting: names, labels and annotations not mapped" in notes
    assert "imported SLOs use 30d" in notes


def test_openslo_example_resolves_indicator_refs_and_skips_calendar_windows() -> None:
    loaded = load_slo_file(EXAMPLES / "openslo.yaml")
    assert loaded.format is SloFormat.OPENSLO
    (spec,) = loaded.specs
    assert spec.name == "batch-e2e"
    assert spec.sli == LatencySli(LatencyMetric.E2E, 10.0, SliSource.METRICS)
    assert (spec.objective_ratio, spec.period, dict(spec.labels)) == (
        0.99,
        "28d",
        {"service": "batch"},
    )
    (note,) = loaded.notes
    assert "batch-availability): skipped; document[2].spec.timeWindow[0]: calendar windows" in note


E2E = "vllm:e2e_request_latency_seconds"
W = "{{.window}}"  # Sloth's window placeholder
SLOTH_LATENCY = {
    "version": "prometheus/v1",
    "service": "svc",
    "slos": [
        {
            "name": "e2e",
            "objective": 99.5,
            "sli": {
                "events": {
                    "error_query": f"sum(rate({E2E}_count[{W}])) - "
                    f'sum(rate({E2E}_bucket{{le="3"}}[{W}]))',
                    "total_query": f"sum(rate({E2E}_count[{W}]))",
                }
            },
        }
    ],
}


def sloth_with(**changes: Any) -> dict[str, Any]:
    """A deep copy of SLOTH_LATENCY with `changes` to its SLO: a test may edit what it gets."""
    document = copy.deepcopy(SLOTH_LATENCY)
    document["slos"][0].update(changes)
    return document


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            SLOTH_LATENCY,
            "slos[0] (as a servewatch spec): sli.threshold_s: 3 s is not a bucket bound of " + E2E,
        ),
        (
            sloth_with(objective=100),
            "sloth.yaml: slos[0].objective: must be a percentage above 0 and below 100, got 100",
        ),
        (
            sloth_with(objective="high"),
            "sloth.yaml: slos[0].objective: must be a percentage such as 99.9",
        ),
        ({**SLOTH_LATENCY, "service": None}, "sloth.yaml: service: is required"),
    ],
)
def test_sloth_errors_name_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        import_sloth(document, where="sloth.yaml")
    assert message in str(caught.value)


def test_sloth_raw_and_plugin_slis_are_skipped_with_a_note() -> None:
    raw = sloth_with(sli={"raw": {"error_ratio_query": "x"}}, name="raw")
    specs, notes = import_sloth(raw, where="s.yaml")
    assert specs == ()
    assert any("slos[0]: skipped; only sli.events maps" in n and "found raw" in n for n in notes)


def test_sloth_unknown_fields_are_noted() -> None:
    document = sloth_with(objective=99, info_labels={"a": "b"})
    document["slos"][0]["sli"]["events"]["error_query"] = document["slos"][0]["sli"]["events"][
        "error_query"
    ].replace('le="3"', 'le="2.5"')
    specs, notes = import_sloth(document, where="s.yaml")
    assert [s.name for s in specs] == ["svc-e2e"]
    assert "s.yaml: slos[0].info_labels: not mapped" in notes


@pytest.mark.parametrize(
    ("queries", "expected"),
    [
        (
            {
                "good": 'vllm_time_to_first_token_seconds_bucket{le="0.25",model_name="m"}',
                "total": 'vllm_time_to_first_token_seconds_count{model_name="m"}',
            },
            (
                {"kind": "latency", "metric": "ttft", "threshold_s": 0.25, "source": "metrics"},
                {"model": "m"},
            ),
        ),
        (
            {
                "bad": 'vllm:request_success_total{finished_reason="error",pool="p"}',
                "total": 'vllm:request_success_total{pool="p"}',
            },
            ({"kind": "availability", "source": "metrics"}, {"pool": "p"}),
        ),
        (
            {
                "good": 'vllm:request_time_per_output_token_seconds_bucket{le="+Inf"}',
                "total": "vllm:request_time_per_output_token_seconds_count",
            },
            None,
        ),
        (
            {
                "good": 'vllm:time_to_first_token_seconds_bucket{le="0.5"}',
                "total": 'vllm:e2e_request_latency_seconds_bucket{le="1.0"}',
            },
            None,
        ),
        ({"good": "http_requests_total", "total": "http_requests_total"}, None),
    ],
)
def test_recognize_sli_by_table(
    queries: dict[str, str], expected: tuple[dict[str, Any], dict[str, str]] | None
) -> None:
    recognized = recognize_sli(queries, where="f")
    if expected is None:
        assert recognized is None
    else:
        assert recognized is not None
        assert (recognized.fields, recognized.scope) == expected


def openslo_slo(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "indicatorRef": "ttft",
        "timeWindow": [{"duration": "7d", "isRolling": True}],
        "budgetingMethod": "Occurrences",
        "objectives": [{"target": 0.99}, {"targetPercent": 99.9}],
    }
    return {
        "apiVersion": "openslo/v1",
        "kind": "SLO",
        "metadata": {"name": "x"},
        "spec": {**base, **spec},
    }


OPENSLO_SLI = yaml.safe_load(
    """
apiVersion: openslo/v1
kind: SLI
metadata: {name: ttft}
spec:
  ratioMetric:
    counter: true
    good:
      metricSource:
        type: Prometheus
        spec: {query: 'vllm:time_to_first_token_seconds_bucket{le="1.0"}'}
    total:
      metricSource: {type: Prometheus, spec: {query: 'vllm:time_to_first_token_seconds_count'}}
"""
)


def test_openslo_objectives_become_one_spec_each() -> None:
    specs, notes = import_openslo([OPENSLO_SLI, openslo_slo()], where="o.yaml")
    assert [(s.name, s.objective_ratio, s.period) for s in specs] == [
        ("x-0", 0.99, "7d"),
        ("x-1", 0.999, "7d"),
    ]
    assert notes == ()


@pytest.mark.parametrize(
    ("slo", "note"),
    [
        (openslo_slo(budgetingMethod="Timeslices"), "budgetingMethod Timeslices does not map"),
        (
            openslo_slo(timeWindow=[{"duration": "1d", "isRolling": True}]),
            "1d is not 7d, 28d or 30d",
        ),
        (openslo_slo(indicatorRef="missing"), "SLI 'missing' not in file"),
        (
            openslo_slo(indicatorRef=None, indicator={"spec": {"ratioMetric": {"good": {}}}}),
            "needs total and one of good or bad",
        ),
        (
            openslo_slo(indicatorRef=None, indicator={"spec": {"thresholdMetric": {}}}),
            "only ratioMetric maps",
        ),
    ],
)
def test_openslo_parts_that_do_not_map_are_noted(slo: dict[str, Any], note: str) -> None:
    specs, notes = import_openslo([OPENSLO_SLI, slo], where="o.yaml")
    assert specs == ()
    assert any(note in n for n in notes), notes


def test_openslo_alert_policies_and_other_kinds_are_noted(tmp_path: Path) -> None:
    path = tmp_path / "o.yaml"
    service = {"apiVersion": "openslo/v1", "kind": "Service", "metadata": {"name": "s"}}
    documents = [OPENSLO_SLI, service, openslo_slo(alertPolicies=["p"])]
    path.write_text(yaml.safe_dump_all(documents), encoding="utf-8")
    loaded = load_slo_file(path)
    assert len(loaded.specs) == 2
    assert any("kind Service not mapped" in n for n in loaded.notes)
    assert any("alertPolicies: not mapped" in n for n in loaded.notes)
