"""The gateway-rejection detector and what it reads: the endpoint picker's names of both
generations catalogued onto the gateway signals; the emulated gateway's page (only for a fleet
with an admission limit); findings on small hand-built counters (baseline, series born at the
first refusal, bad requests that are no rejection, tenants) and on emulated fleets that shed
under a traffic step, stay below their limit, or have no limit at all."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.emulator.fleet_config import AdmissionSpec, FleetConfig
from servewatch.emulator.gateway_metrics import GatewayMetrics, GatewaySpec, go_float
from servewatch.emulator.workload import RateStep
from servewatch.health.detectors import default_detectors, examine
from servewatch.health.finding import Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.gateway_rejection import GatewayRejectionDetector
from servewatch.health.traffic_step import TrafficStepDetector
from servewatch.pipeline.metric_sli import series_dimensions
from servewatch.pipeline.signals import Signal, Source
from servewatch.store import Store
from tests.health_fleet import START, fleet_config, recorded_inputs

T0 = datetime(2026, 11, 19)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _page(requests: str, errors: str, *, routed: float, shed: float) -> str:
    labels = f'model_name="{MODEL}",target_model_name="{MODEL}"'
    return (
        f"# TYPE {requests} counter\n{requests}{{{labels}}} {routed}\n"
        f"# TYPE {errors} counter\n"
        f'{errors}{{error_code="InferencePoolResourceExhausted",{labels}}} {shed}\n'
        "# TYPE inference_pool_average_kv_cache_utilization gauge\n"
        'inference_pool_average_kv_cache_utilization{name="chat"} 0.25\n'
        "# TYPE inference_pool_average_queue_size gauge\n"
        'inference_pool_average_queue_size{name="chat"} 1.5\n'
        "# TYPE inference_pool_ready_pods gauge\n"
        'inference_pool_ready_pods{name="chat"} 4\n'
    )


@pytest.mark.parametrize(
    ("requests", "errors"),
    [
        ("inference_objective_request_total", "inference_objective_request_error_total"),
        ("inference_model_request_total", "inference_model_request_error_total"),
    ],
    ids=["objective", "model"],
)
def test_both_generations_of_the_pickers_names_are_the_gateway_signals(
    tmp_path: Path, requests: str, errors: str
) -> None:
    # AUTO: the page's families say it is a gateway's.
    target = Target("epp", TargetKind.AUTO, "http://127.0.0.1:9/metrics", pool="chat")
    page = _page(requests, errors, routed=120.0, shed=7.0)
    with Store.open(tmp_path / "db.duckdb") as store:
        report = ingest_pages([Page(target, T0, page)], store=store)
        window = store.read_window()
    assert not report.line_errors
    series = window.series.sort("metric")
    assert series["source"].unique().to_list() == [Source.INFERENCE_GATEWAY.value]
    by_metric = dict(zip(series["metric"], series["signal"], strict=True))
    assert by_metric == {
        "inference_objective_request_total": Signal.GATEWAY_REQUESTS.value,
        "inference_objective_request_error_total": Signal.GATEWAY_REQUEST_ERRORS.value,
        "inference_pool_average_kv_cache_utilization": Signal.POOL_KV_CACHE_USAGE_RATIO.value,
        "inference_pool_average_queue_size": Signal.POOL_REQUESTS_WAITING_MEAN.value,
        "inference_pool_ready_pods": Signal.POOL_READY_REPLICAS.value,
    }
    error_labels = json.loads(
        series.filter(pl.col("signal") == Signal.GATEWAY_REQUEST_ERRORS.value)["labels"].item()
    )
    assert error_labels == {
        "error_code": "InferencePoolResourceExhausted",
        "model_name": MODEL,
        "target_model_name": MODEL,
    }
    assert window.targets["kind"].to_list() == ["gateway"]
    # Kept among the dimensions the detectors read, under the target's pool, on no replica.
    dims = series_dimensions(window.series.lazy(), window.targets.lazy()).collect()
    assert set(dims["pool"]) == {"chat"}
    assert dims["replica"].null_count() == dims.height


def test_a_page_with_both_generations_keeps_the_newer_names_only(tmp_path: Path) -> None:
    target = Target("epp", TargetKind.GATEWAY, "http://127.0.0.1:9/metrics", pool="chat")
    labels = f'model_name="{MODEL}",target_model_name="{MODEL}"'
    page = (
        f"inference_objective_request_total{{{labels}}} 10\n"
        f"inference_model_request_total{{{labels}}} 10\n"
    )
    with Store.open(tmp_path / "db.duckdb") as store:
        ingest_pages([Page(target, T0, page)], store=store)
        window = store.read_window()
    assert window.series["metric"].to_list() == ["inference_objective_request_total"]
    assert window.series["signal"].to_list() == [Signal.GATEWAY_REQUESTS.value]


def test_the_gateway_page_counts_as_the_picker_does() -> None:
    metrics = GatewayMetrics(GatewaySpec(name="chat", pool="chat", model="m"))
    page = metrics.page().decode()
    assert "inference_objective_request_error_total" not in page  # born at its first error
    for code in (None, None, "InferencePoolResourceExhausted", "ModelServerError"):
        metrics.gateway_request("m", code)
    page = metrics.page().decode()
    # A refused request is an error only; one a replica turned away was routed first.
    assert 'inference_objective_request_total{model_name="m",target_model_name="m"} 3\n' in page
    assert (
        'inference_objective_request_error_total{error_code="InferencePoolResourceExhausted",'
        'model_name="m",target_model_name="m"} 1\n'
    ) in page
    assert page.endswith("servewatch_emulated 1\n")
    assert [go_float(v) for v in (3.0, 0.5, 1e6, 1234567.0, 1e-5)] == [
        "3",
        "0.5",
        "1e+06",
        "1.234567e+06",
        "1e-05",
    ]


# -- hand-built counters --------------------------------------------------------------------


def _inputs(
    routed: list[float],
    rejected: list[float],
    *,
    extra_errors: list[float] | None = None,
    spared_model: list[float] | None = None,
) -> HealthInputs:
    """A gateway (pool `chat`) scraped every minute: cumulative counters from per-minute
    counts, the counts of list index k read by the scrape at minute k + 1 (so they land in
    that minute); refusals in a series born at its first refusal."""
    minutes = len(routed)
    labels = {"model_name": MODEL, "target_model_name": MODEL}
    series: list[tuple[int, str, dict[str, str], list[float]]] = [
        (1, Signal.GATEWAY_REQUESTS.value, labels, routed),
        (
            2,
            Signal.GATEWAY_REQUEST_ERRORS.value,
            {**labels, "error_code": "InferencePoolResourceExhausted"},
            rejected,
        ),
    ]
    if extra_errors is not None:
        series.append(
            (
                3,
                Signal.GATEWAY_REQUEST_ERRORS.value,
                {**labels, "error_code": "BadRequest"},
                extra_errors,
            )
        )
    if spared_model is not None:
        other = {"model_name": "batch", "target_model_name": "batch"}
        series.append((4, Signal.GATEWAY_REQUESTS.value, other, spared_model))
    points: list[tuple[int, datetime, float]] = []
    for series_id, _, _, counts in series:
        total, born = 0.0, False
        for minute in range(minutes + 1):
            if minute:
                total += counts[minute - 1]
            born = born or total > 0 or series_id != 2
            if born:
                points.append((series_id, T0 + timedelta(minutes=minute), total))
    dimensions = pl.LazyFrame(
        {
            "series_id": [s[0] for s in series],
            "target_id": ["epp" for _ in series],
            "signal": [s[1] for s in series],
            "labels": [json.dumps(s[2], sort_keys=True) for s in series],
            "pool": ["chat" for _ in series],
            "replica": [None for _ in series],
            "host": [None for _ in series],
            "zone": [None for _ in series],
            "le": [None for _ in series],
        },
        schema_overrides={
            "replica": pl.String(),
            "host": pl.String(),
            "zone": pl.String(),
            "le": pl.Float64(),
        },
    )
    empty = pl.LazyFrame()
    return HealthInputs(
        start=T0,
        end=T0 + timedelta(minutes=minutes + 1),
        points=pl.LazyFrame(
            {
                "series_id": [p[0] for p in points],
                "ts": [p[1] for p in points],
                "value": [p[2] for p in points],
            },
            schema={"series_id": pl.Int32(), "ts": pl.Datetime("us"), "value": pl.Float64()},
        ),
        dimensions=dimensions.with_columns(pl.col("series_id").cast(pl.Int32())),
        requests=empty,
        targets=empty,
        scrapes=empty,
    )


def _only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.summary for f in findings]
    return findings[0]


def _evidence(finding: Finding) -> dict[str, float]:
    return {e.name: e.value for e in finding.evidence}


def test_refusals_above_the_baseline_are_one_episode_from_the_first_refused_minute() -> None:
    # 40 quiet minutes, then 10 minutes refusing 30 of 330; the error series is born at 41.
    routed = [300.0] * 50
    rejected = [0.0] * 40 + [30.0] * 10
    finding = _only(GatewayRejectionDetector().detect(_inputs(routed, rejected)))
    assert finding.kind is FindingKind.GATEWAY_REJECTION
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.POOL, "chat")
    # The first refusals are the series' first sample: counted, so the onset is on time.
    assert finding.start == T0 + timedelta(minutes=41)
    assert finding.end is None
    evidence = _evidence(finding)
    assert evidence["rejected_requests"] == 300.0
    assert evidence["gateway_requests"] == 3300.0
    assert evidence["rejected_ratio"] == pytest.approx(300 / 3300)
    assert "refused 9% of the requests" in finding.summary
    assert finding.confidence > 0.99


def test_an_episode_that_ends_has_an_end_and_a_steady_share_is_its_own_baseline() -> None:
    routed = [300.0] * 60
    # 1% refused all along (under the 2-point bar), 12% for minutes 30-39.
    rejected = [3.0] * 30 + [40.0] * 10 + [3.0] * 20
    finding = _only(GatewayRejectionDetector().detect(_inputs(routed, rejected)))
    assert finding.start == T0 + timedelta(minutes=31)
    assert finding.end == T0 + timedelta(minutes=41)
    rejected_ratio = next(e for e in finding.evidence if e.name == "rejected_ratio")
    assert rejected_ratio.baseline == pytest.approx(3 / 303)


def test_noise_a_single_minute_and_bad_requests_are_no_rejection() -> None:
    detector = GatewayRejectionDetector()
    routed = [300.0] * 40
    # a 1-point rise, one refusing minute, and bad requests (the client's fault) by the dozen
    small = [0.0] * 20 + [4.0] * 20
    single = [0.0] * 20 + [60.0] + [0.0] * 19
    assert detector.detect(_inputs(routed, small)) == []
    assert detector.detect(_inputs(routed, single)) == []
    bad = [0.0] * 20 + [50.0] * 20
    assert detector.detect(_inputs(routed, [0.0] * 40, extra_errors=bad)) == []


def test_only_some_models_refused_suggests_a_per_tenant_quota() -> None:
    routed = [300.0] * 50
    rejected = [0.0] * 40 + [60.0] * 10
    finding = _only(
        GatewayRejectionDetector().detect(_inputs(routed, rejected, spared_model=[100.0] * 50))
    )
    assert f"only {MODEL} were refused" in finding.summary
    assert "per-tenant quota" in finding.suggestion


def test_without_gateway_counters_there_is_nothing_to_read() -> None:
    inputs = _inputs([300.0] * 10, [0.0] * 10)
    inputs = replace(inputs, dimensions=inputs.dimensions.filter(pl.lit(value=False)))
    assert GatewayRejectionDetector().detect(inputs) == []


def test_it_runs_by_default_right_after_the_traffic_step() -> None:
    kinds = [type(d) for d in default_detectors()]
    assert kinds.index(GatewayRejectionDetector) == kinds.index(TrafficStepDetector) + 1


# -- emulated fleets ---------------------------------------------------------------------------

MINUTES = 40
STEP_AT_MIN = 20
STEP_START = START + timedelta(minutes=STEP_AT_MIN)
# Four requests/s, stepping to twelve: a gateway limit of 5/s sheds, one of 20/s does not.
STEPS = (RateStep(at_s=STEP_AT_MIN * 60.0, rate_rps=12.0),)


def _limited(rate_rps: float | None) -> FleetConfig:
    config = fleet_config(steps=STEPS)
    if rate_rps is None:
        return config
    return replace(config, admission=AdmissionSpec(rate_rps=rate_rps, burst=10.0))


@pytest.fixture(scope="module")
def shedding(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, HealthInputs]:
    folder = tmp_path_factory.mktemp("shedding") / "fixture"
    return folder, recorded_inputs(_limited(5.0), folder, minutes=MINUTES)


def _gateway_findings(inputs: HealthInputs) -> list[Finding]:
    return [f for f in examine(inputs) if f.kind is FindingKind.GATEWAY_REJECTION]


@pytest.mark.slow
def test_a_fleet_that_sheds_under_a_step_has_one_finding_near_the_step(
    shedding: tuple[Path, HealthInputs],
) -> None:
    folder, inputs = shedding
    manifest = json.loads((folder / "manifest.json").read_text())
    gateway = [t for t in manifest["targets"] if t["kind"] == "gateway"]
    assert gateway == [
        {
            "id": "gateway/default",
            "kind": "gateway",
            "job": "gateway",
            "labels": {"pool": "default"},
            "replicas": [f"vllm-{i}" for i in range(6)],
            "model": MODEL,
            "pool": "default",
            "gpus": None,
            "pages": "pages/gateway/default",
        }
    ]
    last = max((folder / "pages" / "gateway" / "default").iterdir())
    assert b'error_code="InferencePoolResourceExhausted"' in gzip.decompress(last.read_bytes())
    finding = _only(_gateway_findings(inputs))
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.POOL, "default")
    assert STEP_START <= finding.start <= STEP_START + timedelta(minutes=3)
    assert finding.end is None
    evidence = _evidence(finding)
    assert 0.05 < evidence["rejected_ratio"] < 0.5
    assert evidence["rejected_requests"] > 100
    # The replicas had room: the limit, not the pool, refused them.
    assert evidence["requests_waiting_per_replica"] < 1.0
    assert "had room" in finding.summary
    assert "raise it to the pool's capacity" in finding.suggestion


@pytest.mark.slow
def test_the_same_fleet_below_its_limit_has_no_finding(tmp_path: Path) -> None:
    inputs = recorded_inputs(_limited(20.0), tmp_path / "fixture", minutes=MINUTES)
    assert _gateway_findings(inputs) == []


@pytest.mark.slow
def test_a_fleet_without_a_limit_has_no_gateway_and_no_finding(tmp_path: Path) -> None:
    folder = tmp_path / "fixture"
    inputs = recorded_inputs(_limited(None), folder, minutes=MINUTES)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {t["kind"] for t in manifest["targets"]} == {"vllm", "dcgm"}
    assert not (folder / "pages" / "gateway").exists()
    assert GatewayRejectionDetector().detect(inputs) == []
