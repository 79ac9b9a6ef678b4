"""Recorded SLI series: every SLI record `servewatch rules sli` writes is known to the catalogue
that reads them back, `import prometheus --recorded` stores only those, as evaluated, once,
`sli --recorded` answers them at an instant, and the raw import leaves VictoriaMetrics'
staleness markers out. The server is a fake of the HTTP API (tests/test_prometheus_api.py)."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.prometheus.api import PrometheusApi
from servewatch.collectors.prometheus.reader import (
    ImportWindow,
    Resolution,
    import_range,
    plan_import,
    to_ms,
)
from servewatch.collectors.prometheus.recorded import import_recorded
from servewatch.pipeline.recorded_sli import record_catalogue
from servewatch.slo.sli_rules import SliLabels, sli_rules
from servewatch.store import Store
from tests.test_prometheus_api import T0, URL, VLLM0, FakePrometheus, FakeSeries, ms


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"window": "1h", "quantiles": (0.5, 0.95, 0.999)},
        {"metric_prefix": "vllm_", "labels": SliLabels(replica="pod", pool="service")},
    ],
    ids=["defaults", "1h-window", "relabelled"],
)
def test_every_sli_record_of_the_rules_is_catalogued(options: dict[str, Any]) -> None:
    rules = sli_rules(**options)
    records = pl.LazyFrame({"record": list(rules.records)})
    catalogue = record_catalogue(records).collect()
    bucket_rates = {r for r in rules.records if "_bucket:" in r}
    assert set(catalogue["record"]) == set(rules.records) - bucket_rates
    window_s = {"1h": 3600.0}.get(str(options.get("window")), 300.0)
    assert set(catalogue["window_s"]) == {window_s}
    levels = dict(zip(catalogue["record"], catalogue["level"], strict=True))
    assert all(record.startswith(f"{level}:") for record, level in levels.items())
    slis = set(catalogue["sli"])
    assert {"ttft_p50_s", "requests_per_s", "error_ratio", "kv_cache_usage_ratio_mean"} <= slis
    if options.get("quantiles"):
        assert "e2e_p99_9_s" in slis


def test_names_that_are_no_sli_record_are_left_out() -> None:
    names = [
        "pool:vllm_time_to_first_token_seconds_bucket:rate5m",  # an input, not an SLI
        "job:http_requests:rate5m",
        "cluster:vllm_request_success:rate5m",  # no such level
        "pool:vllm_request_success:mean5m",  # no such operation for it
        "pool:vllm_request_success:rate5m",
        "pool_model:sglang_time_to_first_token_seconds:p99_9_10m",  # another prefix is fine
    ]
    catalogue = record_catalogue(pl.LazyFrame({"record": names})).collect()
    assert catalogue.rows() == [
        ("pool:vllm_request_success:rate5m", "pool", "requests_per_s", 300.0),
        (
            "pool_model:sglang_time_to_first_token_seconds:p99_9_10m",
            "pool_model",
            "ttft_p99_9_s",
            600.0,
        ),
    ]


def _recorded(name: str, labels: dict[str, str], values: list[float]) -> FakeSeries:
    # Evaluated every 30 s from T0 + 10 s.
    return FakeSeries(
        {"__name__": name, **labels}, [(ms(10 + 30 * i), v) for i, v in enumerate(values)]
    )


def _fleet_records() -> list[FakeSeries]:
    return [
        _recorded("pool:vllm_request_success:rate5m", {"pool": "chat"}, [1.0, 2.0, 3.0, 4.0]),
        _recorded("pool:vllm_request_success:rate5m", {"pool": "batch"}, [0.5, 0.5, 0.5, 0.5]),
        _recorded("pool:vllm_time_to_first_token_seconds:p90_5m", {"pool": "chat"}, [0.2] * 4),
        _recorded(
            "pool:vllm_prefix_cache_hits:ratio_rate5m", {"pool": "batch"}, [0.1, 0.1, 0.1, math.nan]
        ),
        _recorded("replica:vllm_kv_cache_usage_perc:mean5m", {"replica": "vllm-0"}, [0.3] * 4),
        _recorded(
            "pool:vllm_time_to_first_token_seconds_bucket:rate5m",
            {"pool": "chat", "le": "0.1"},
            [7.0] * 4,
        ),
        _recorded("job:http_requests:rate5m", {"job": "api"}, [9.0] * 4),
    ]


def _import(fake: FakePrometheus, store: Store, **changes: Any) -> Any:
    spec: dict[str, Any] = {"start": T0, "end": T0 + timedelta(minutes=2), "step_s": 30.0}
    spec.update(changes)
    with fake.client() as client:
        return import_recorded(PrometheusApi(client, URL), store=store, window=ImportWindow(**spec))


def test_recorded_import_stores_only_sli_records_as_evaluated_and_once(store: Store) -> None:
    fake = FakePrometheus(_fleet_records())
    report = _import(fake, store, chunk_points=2)
    assert report.records == (
        "pool:vllm_prefix_cache_hits:ratio_rate5m",
        "pool:vllm_request_success:rate5m",
        "pool:vllm_time_to_first_token_seconds:p90_5m",
        "replica:vllm_kv_cache_usage_perc:mean5m",
    )
    assert report.chunks == 2
    assert report.queries == 8
    assert report.new_points == report.points_read == 20
    points = store.read_recorded_points().collect()
    chat = points.filter(
        (pl.col("record") == "pool:vllm_request_success:rate5m")
        & (pl.col("labels") == '{"pool":"chat"}')
    )
    assert [to_ms(ts) for ts in chat["ts"]] == [ms(10 + 30 * i) for i in range(4)]
    assert chat["value"].to_list() == [1.0, 2.0, 3.0, 4.0]
    assert set(points["source"]) == {URL}
    again = _import(fake, store)
    assert again.new_points == 0
    assert store.count("recorded_points") == 20


def test_a_recorded_import_reads_as_evaluated_only(store: Store) -> None:
    with pytest.raises(ValueError, match="resolution raw"):
        _import(FakePrometheus(_fleet_records()), store, resolution=Resolution.STEP)


def _sli(runner: CliRunner, db: Path, *args: str) -> Any:
    return runner.invoke(app, ["--db", str(db), "sli", "--recorded", *args])


def test_sli_recorded_answers_each_series_latest_evaluation(
    runner: CliRunner, tmp_path: Path
) -> None:
    db = tmp_path / "s.duckdb"
    with Store.open(db) as store:
        _import(FakePrometheus(_fleet_records()), store)
    # Between the second and third evaluations: the second's values.
    at = (T0 + timedelta(seconds=55)).isoformat() + "Z"
    result = _sli(runner, db, "--by", "pool", "--to", at, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["by"] == "pool"
    assert document["at"] == "2026-11-18T10:00:55Z"
    groups = {g["labels"]["pool"]: g for g in document["groups"]}
    assert groups["chat"]["slis"] == {"requests_per_s": 2.0, "ttft_p90_s": 0.2}
    assert groups["chat"]["at"] == "2026-11-18T10:00:40Z"
    assert groups["chat"]["window_s"] == 300.0
    assert groups["batch"]["slis"] == {"requests_per_s": 0.5, "prefix_cache_hit_ratio": 0.1}
    # Without --to: the newest evaluation, where a ratio over no traffic is null.
    newest = json.loads(_sli(runner, db, "--by", "pool", "--json").stdout)
    assert newest["at"] == "2026-11-18T10:01:40Z"
    batch = next(g for g in newest["groups"] if g["labels"] == {"pool": "batch"})
    assert batch["slis"]["prefix_cache_hit_ratio"] is None
    replica = json.loads(_sli(runner, db, "--json").stdout)
    assert [g["labels"] for g in replica["groups"]] == [{"replica": "vllm-0"}]
    table = _sli(runner, db, "--by", "pool")
    assert table.exit_code == 0
    assert "requests_per_s" in table.stdout


def test_sli_recorded_says_when_nothing_is_recorded(runner: CliRunner, tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    result = _sli(runner, db, "--by", "pool", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["groups"] == []
    assert "import prometheus URL --recorded first" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--by", "fleet"], "--recorded with --by fleet: the rules record replica, pool"),
        (["--window", "5m"], "--recorded with --window"),
        (["--from", "2026-11-18T10:00:00Z"], "--recorded with --from"),
        (["--ttft-ms", "500"], "--recorded with --ttft-ms"),
        (["--source", "traces"], "--recorded with --source"),
    ],
)
def test_sli_recorded_refuses_options_it_cannot_honour(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    result = _sli(runner, db, *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resolution", "step"], "--recorded with --resolution step"),
        (["--catalogued-only"], "--recorded with --keep-uncatalogued/--catalogued-only"),
    ],
)
def test_import_recorded_refuses_raw_only_options(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(
        app,
        [
            "--db",
            str(tmp_path / "s.duckdb"),
            "import",
            "prometheus",
            URL,
            "--recorded",
            "--from",
            "2026-11-18T10:00:00Z",
            "--to",
            "2026-11-18T11:00:00Z",
            "--config",
            str(tmp_path / "none.toml"),
            *args,
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())


def test_raw_import_leaves_staleness_markers_out(store: Store) -> None:
    """VictoriaMetrics answers a range vector with its staleness markers as NaN at the failed
    scrape; a NaN a scrape did read stays."""
    up = [1.0, 1.0, 0.0, 1.0]
    values = [1.0, math.nan, math.nan, 4.0]
    stamps = [ms(15 * i) for i in range(4)]
    fake = FakePrometheus(
        [
            FakeSeries(
                {"__name__": "vllm:num_requests_running", **VLLM0},
                list(zip(stamps, values, strict=True)),
            ),
            FakeSeries({"__name__": "up", **VLLM0}, list(zip(stamps, up, strict=True))),
        ]
    )
    window = ImportWindow(start=T0, end=T0 + timedelta(minutes=1), step_s=15.0)
    with fake.client() as client:
        api = PrometheusApi(client, URL)
        report = import_range(api, store=store, plan=plan_import(api, window=window))
    points = store.read_points().collect()
    assert [to_ms(ts) for ts in points["ts"]] == [stamps[0], stamps[1], stamps[3]]
    assert math.isnan(points["value"][1])
    assert report.stale_markers == 1
