"""The fleet gauges' one stateful part, the SLO event counters (monotonic, each minute's events
counted once, late events added when they arrive), the exposition of a snapshot, and the API's
bearer token."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import polars as pl
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from servewatch.config import ConfigError, parse_config
from servewatch.fleet_gauges import (
    EventCounters,
    FleetGaugeCollector,
    FleetGaugeSnapshot,
    PoolGauges,
    SloGauges,
)
from servewatch.live_page import BuiltPage
from servewatch.scraping import TargetHealth
from servewatch.service import SelfMetrics
from servewatch.service_http import ServiceApi, serve_health
from servewatch.slo.buckets import LatencyMetric
from servewatch.slo.spec import LatencySli, SliSource, SloSpec

T0 = datetime(2026, 11, 18, 12, 0)


def spec(name: str, period_s: int) -> SloSpec:
    return SloSpec(
        name=name,
        sli=LatencySli(metric=LatencyMetric.TTFT, threshold_s=0.5, source=SliSource.TRACES),
        objective_ratio=0.99,
        period_s=period_s,
        windows=(),
    )


def minutes(rows: list[tuple[str, int, int, int]]) -> pl.DataFrame:
    """(slo, minute offset from T0, good, total) rows."""
    return pl.DataFrame(
        {
            "slo": [r[0] for r in rows],
            "minute_ts": [T0 + timedelta(minutes=r[1]) for r in rows],
            "good": [r[2] for r in rows],
            "total": [r[3] for r in rows],
        }
    )


@pytest.mark.parametrize(
    ("evaluations", "expected"),
    [
        pytest.param(
            [([("a", 0, 9, 10), ("a", 1, 5, 5)], 2)], (14, 15), id="whole minutes before at"
        ),
        pytest.param(
            [([("a", 0, 9, 10), ("a", 1, 5, 5)], 1)], (9, 10), id="the minute of at waits"
        ),
        pytest.param([([("a", 0, 9, 10)], 1), ([("a", 0, 9, 10)], 2)], (9, 10), id="counted once"),
        pytest.param(
            [([("a", 0, 9, 10)], 1), ([("a", 0, 11, 13)], 2)], (11, 13), id="late events added"
        ),
        pytest.param(
            [([("a", 0, 9, 10)], 1), ([("a", 0, 3, 4)], 2)], (9, 10), id="never goes down"
        ),
        pytest.param(
            [([("a", -10, 7, 7), ("a", 0, 1, 2)], 1)], (1, 2), id="before the period: left out"
        ),
        pytest.param(
            [([("a", 0, 1, 1), ("a", 0, 2, 2)], 1)], (3, 3), id="rows of one minute summed"
        ),
    ],
)
def test_event_counters(
    evaluations: list[tuple[list[tuple[str, int, int, int]], int]], expected: tuple[int, int]
) -> None:
    counters = EventCounters()
    specs = [spec("a", 5 * 60)]
    counted = {}
    for rows, at_minute in evaluations:
        counted = counters.add(minutes(rows), specs=specs, at=T0 + timedelta(minutes=at_minute))
    assert counted["a"] == expected


def test_a_snapshot_is_served_whole_and_absent_figures_are_left_out() -> None:
    collector = FleetGaugeCollector()
    registry = CollectorRegistry()
    registry.register(collector)
    collector.update(
        FleetGaugeSnapshot(
            at=T0,
            slos=(
                SloGauges("a", 9, 10, 0.25, 0.9, (("1h", 3.0), ("5m", None))),
                SloGauges("quiet", 0, 0, None, None, ()),
            ),
            pools=(PoolGauges("chat", 4, (1.0, 2.0, 3.0), 0.5, 7.0, 0.4), PoolGauges("idle")),
            findings_active={"slow_replica": 1},
        )
    )
    served = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert served[("servewatch_slo_good_events_total", (("slo", "a"),))] == 9
    assert served[("servewatch_slo_events_total", (("slo", "quiet"),))] == 0
    assert served[("servewatch_slo_burn_rate", (("slo", "a"), ("window", "1h")))] == 3.0
    assert ("servewatch_slo_burn_rate", (("slo", "a"), ("window", "5m"))) not in served
    assert ("servewatch_slo_budget_remaining_ratio", (("slo", "quiet"),)) not in served
    assert served[("servewatch_pool_capacity_rps", (("bound", "high"), ("pool", "chat")))] == 3
    assert served[("servewatch_pool_queue_depth", (("pool", "chat"),))] == 7
    assert not [k for k in served if ("pool", "idle") in k[1]]
    assert served[("servewatch_findings_active", (("mode", "slow_replica"),))] == 1


def test_the_api_token_guards_everything_but_healthz() -> None:
    metrics = SelfMetrics()
    api = ServiceApi(read_window=lambda q: b"", answer=lambda name, params: {"name": name})
    server = serve_health(
        metrics, TargetHealth(failing_after=1), port=0, api=api, bearer_token="t0k"
    )
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert httpx.get(f"{url}/healthz").status_code == 200
        for path in ("/metrics", "/api/v1/alerts", "/"):
            assert httpx.get(f"{url}{path}").status_code == 401, path
            wrong = httpx.get(f"{url}{path}", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
        ok = httpx.get(f"{url}/api/v1/alerts", headers={"Authorization": "Bearer t0k"})
        assert ok.json() == {"name": "alerts"}
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("api", "error"),
    [
        ({"bearer_token": "has space"}, "api.bearer_token"),
        ({"listen": "127.0.0.1:1"}, "api.listen"),
    ],
)
def test_bad_api_settings_are_named(api: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace(".", r"\.")):
        parse_config({"api": api}, source=None)


def test_the_api_token_is_read() -> None:
    assert parse_config({"api": {"bearer_token": "abc"}}, source=None).api.bearer_token == "abc"


def test_a_page_that_cannot_be_built_is_a_500_naming_why_and_the_api_still_answers() -> None:
    def broken() -> BuiltPage:
        raise TypeError("a chart met a null")

    api = ServiceApi(
        read_window=lambda q: b"", answer=lambda name, params: {"name": name}, page=broken
    )
    server = serve_health(SelfMetrics(), TargetHealth(failing_after=1), port=0, api=api)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        page = httpx.get(f"{url}/")
        assert page.status_code == 500
        assert page.text == "the report page could not be built: TypeError: a chart met a null\n"
        assert httpx.get(f"{url}/api/v1/slo").json() == {"name": "slo"}
    finally:
        server.shutdown()
        server.server_close()
