"""servewatch against a real Prometheus 2.42 on one live emulated fleet with a replica restart.

One recording serves the module: four emulated replicas and two GPU exporters on 127.0.0.1,
scraped every second by a real Prometheus for about 22 s, during which replica vllm-1 crashes
at 6 s and starts again (1 s cold start) at 10 s, so its counters drop back to zero: a
counter reset between two scrapes, with failed scrapes (`up == 0`) in between.

- `servewatch import prometheus` by default (issue #19) reads the samples as stored: the
  stored points are exactly Prometheus's raw samples, and `sli --source histograms` figures
  over them (counter increases, TTFT quantiles, gauge means) equal what PromQL answers for
  the same windows.
- `servewatch import prometheus --resolution step` (issue #4) imports the range at step =
  scrape interval; the stored points must be exactly what Prometheus's own query_range
  answers at the same instants, and importing again must change nothing.
- rate and increase (issue #5): Prometheus's `/api/v1/query` answers `rate(x[w])` and
  `increase(x[w])` at chosen instants; servewatch computes `pipeline.promql.rate_frame` and
  `increase_frame` (the forms the pipelines use) and the scalar `rate` and `increase` at the
  same instants over the samples the reader imported at its default resolution (raw: the
  samples Prometheus stored, at their own scrape timestamps, so both sides see the same
  inputs). The frame forms must agree within 1 %, the scalar forms bit for bit. (The frame
  forms can be a last-digit off: Polars divides a column by a constant as a product with its
  reciprocal.)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.prometheus.api import PrometheusApi
from servewatch.collectors.prometheus.reader import (
    ImportWindow,
    Resolution,
    from_ms,
    import_range,
    plan_import,
    series_labels,
    target_id_of,
    to_ms,
)
from servewatch.emulator.engine import EngineParams
from servewatch.emulator.failures import FailureKind, FailureSpec
from servewatch.emulator.fleet_config import FleetConfig, TopologySpec
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.pipeline.promql import increase, increase_frame, rate, rate_frame
from servewatch.pipeline.sli_report import Grouping, histogram_section
from servewatch.store import Store
from tests.live_prometheus import (
    fleet_ports,
    instant_query,
    live_fleet,
    poll,
    running_prometheus,
    scrape_configs,
)

CRASHED = "vllm-1"
CRASH_AT_S = 6.0
DOWN_S = 1.0  # then a 1 s cold start: back at 8 s
RUN_S = 20.0
COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:e2e_request_latency_seconds_count",
)
RELATIVE_TOLERANCE = 0.01

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Recording:
    client: httpx.Client  # base URL: the Prometheus
    url: str
    start_ms: int  # the fleet's start, to the next whole second
    end_ms: int  # a whole second every target had been scraped at


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recording]:
    config = replace(
        FleetConfig(topology=TopologySpec(zones=("zone-a", "zone-b"))),
        engine=EngineParams(cold_start_s=1.0),
        failures=(
            FailureSpec(
                FailureKind.REPLICA_CRASH, at_s=CRASH_AT_S, target=CRASHED, duration_s=DOWN_S
            ),
        ),
    )
    workdir = tmp_path_factory.mktemp("prometheus")
    ports = fleet_ports(config)
    # Prometheus scrapes the fixed ports before the fleet's clock starts, so that the
    # recording holds the replica's whole life: start, crash, restart.
    unstarted = LiveFleetServer(config.placements(), started_s=0.0, ports=ports)
    with running_prometheus(workdir, scrape_configs(unstarted)) as client:
        # Prometheus applies its targets a few seconds after it is ready: wait for its first
        # (failing) scrapes of every target.
        poll(
            "Prometheus to scrape every target",
            lambda: True if len(instant_query(client, "up")) == len(ports) else None,
        )
        started_s = time.time()
        with live_fleet(config, seed=5, ports=ports):

            def restarted_and_run() -> bool | None:
                up = instant_query(client, f'up{{replica="{CRASHED}"}}')
                running = time.time() - started_s >= RUN_S
                return True if running and up and up[0]["value"][1] == "1" else None

            poll("the crashed replica to be back and the run to end", restarted_and_run)
            end_s = math.floor(time.time()) - 2  # every target scraped since, at 1 s
        # The fleet has stopped; Prometheus answers for the finished recording.
        yield Recording(
            client=client,
            url=str(client.base_url).rstrip("/"),
            start_ms=math.ceil(started_s) * 1000,
            end_ms=end_s * 1000,
        )


# -- issue #19: the default import is exact ---------------------------------------------------

# (PromQL at instant t over range w, the figure of one replica's `sli` histogram block)
PROMQL_FIGURES: tuple[tuple[str, Callable[[dict[str, Any]], float | None]], ...] = (
    (
        "sum by (replica) (increase(vllm:generation_tokens_total[{w}]))",
        lambda b: b["generation_tokens"],
    ),
    ("sum by (replica) (increase(vllm:prompt_tokens_total[{w}]))", lambda b: b["prompt_tokens"]),
    (
        (
            "histogram_quantile(0.95, sum by (replica, le) "
            "(increase(vllm:time_to_first_token_seconds_bucket[{w}])))"
        ),
        lambda b: b["ttft_s"]["p95"],
    ),
    (
        (
            "histogram_quantile(0.99, sum by (replica, le) "
            "(increase(vllm:time_to_first_token_seconds_bucket[{w}])))"
        ),
        lambda b: b["ttft_s"]["p99"],
    ),
    (
        "avg by (replica) (avg_over_time(vllm:kv_cache_usage_perc[{w}]))",
        lambda b: b["kv_cache_usage_ratio"]["mean"],
    ),
    (
        "sum by (replica) (avg_over_time(vllm:num_requests_running[{w}]))",
        lambda b: b["requests_running"]["mean"],
    ),
)


def test_the_default_import_stores_raw_samples_whose_slis_equal_promql(
    recording: Recording, tmp_path: Path
) -> None:
    db = tmp_path / "default.duckdb"
    args = ["--db", str(db), "import", "prometheus", recording.url]
    args += ["--config", str(tmp_path / "absent.toml"), "--json"]
    args += ["--from", str(recording.start_ms // 1000 - 3), "--to", str(recording.end_ms // 1000)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["resolution"] == "raw"
    assert report["problems"] == []

    with Store.open(db) as store:
        # The stored points are the samples Prometheus holds, at their own scrape times.
        points = store.read_points().join(store.read_series(), on="series_id").collect()
        tokens = "vllm:generation_tokens_total"
        range_s = (recording.end_ms - recording.start_ms) // 1000 + 3
        raw = instant_query(
            recording.client, f"{tokens}[{range_s}s]", time_s=recording.end_ms / 1000 - 0.001
        )
        expected = {
            (target_id_of(s["metric"]) or "", round(ts * 1000), float(v))
            for s in raw
            for ts, v in s["values"]
        }
        got = {
            (target_id, to_ms(ts), value)
            for target_id, ts, value in points.filter(pl.col("metric") == tokens)
            .select("target_id", "ts", "value")
            .iter_rows()
        }
        assert got == expected

        window_s = 10
        compared = 0
        for at_ms in range(recording.start_ms + 12_000, recording.end_ms - 1_000 + 1, 1_500):
            at = from_ms(at_ms)
            section = histogram_section(
                store.read_window(from_ts=at - timedelta(seconds=window_s), to_ts=at),
                by=Grouping.REPLICA,
            )
            assert section is not None
            blocks = {g["replica"]: g for g in section["groups"]}
            for expr, pick in PROMQL_FIGURES:
                query = expr.format(w=f"{window_s}s")
                for item in instant_query(recording.client, query, time_s=at_ms / 1000):
                    want = float(item["value"][1])
                    if math.isnan(want):
                        continue
                    got_value = pick(blocks[item["metric"]["replica"]])
                    assert got_value is not None, (query, at_ms)
                    assert math.isclose(got_value, want, rel_tol=1e-9, abs_tol=1e-12), (
                        query,
                        at_ms,
                        got_value,
                        want,
                    )
                    compared += 1
        assert compared >= 50  # six figures, four replicas, six or more instants, less NaNs


# -- issue #4: the import at step = scrape interval --------------------------------------------


def _prometheus_range(rec: Recording, expr: str, *, step_s: int) -> list[dict[str, Any]]:
    body = rec.client.get(
        "/api/v1/query_range",
        params={
            "query": expr,
            "start": str(rec.start_ms // 1000),
            "end": str((rec.end_ms - 1) // 1000),
            "step": str(step_s),
        },
    ).json()
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _stored(db: Path) -> dict[str, pl.DataFrame]:
    with Store.open(db) as store:
        return {
            "targets": store.read_targets().collect(),
            "scrapes": store.read_scrapes().collect(),
            "series": store.read_series().collect(),
            "points": store.read_points().collect(),
        }


def test_a_step_import_stores_what_prometheus_answers_at_each_step(
    recording: Recording, tmp_path: Path
) -> None:
    db = tmp_path / "imported.duckdb"
    args = [
        "--db",
        str(db),
        "import",
        "prometheus",
        recording.url,
        "--config",
        str(tmp_path / "absent.toml"),
        "--from",
        str(recording.start_ms // 1000),
        "--to",
        str(recording.end_ms // 1000),
        "--step",
        "1s",
        "--resolution",
        "step",
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["resolution"] == "step"
    assert {"vllm:generation_tokens_total", "DCGM_FI_DEV_GPU_UTIL"} <= set(report["families"])
    assert report["problems"] == []
    assert report["unassigned_series"] == 0
    tables = _stored(db)

    targets = tables["targets"]
    assert sorted(targets.filter(pl.col("kind") == "vllm")["replica"]) == [
        "vllm-0",
        "vllm-1",
        "vllm-2",
        "vllm-3",
    ]
    assert sorted(targets.filter(pl.col("kind") == "dcgm")["host"]) == ["host-0", "host-1"]
    assert targets["zone"].null_count() == 0
    crashed_id = targets.filter(pl.col("replica") == CRASHED)["target_id"].item()
    failed = tables["scrapes"].filter(~pl.col("ok") & (pl.col("target_id") == crashed_id))
    # The instants while it was down (1 s, then a 1 s cold start); a loaded machine may add
    # a timed-out scrape of another target, which is not this test's business.
    assert 1 <= failed.height <= 5

    points = tables["points"].join(tables["series"], on="series_id")
    seconds = (recording.end_ms - recording.start_ms) // 1000
    for expr, metric, scale in (
        ("vllm:generation_tokens_total", "vllm:generation_tokens_total", 1.0),
        ("vllm:num_requests_running", "vllm:num_requests_running", 1.0),
        ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", 0.01),
    ):
        expected: dict[tuple[str, str, int], float] = {}
        for series in _prometheus_range(recording, expr, step_s=1):
            labels = series["metric"]
            key = (target_id_of(labels) or "", labels.get("gpu") or series_labels(labels))
            for ts_s, value in series["values"]:
                expected[(*key, round(ts_s * 1000))] = float(value) * scale
        got = {
            (target_id, json.loads(labels).get("gpu") or labels, to_ms(ts)): value
            for target_id, labels, ts, value in points.filter(pl.col("metric") == metric)
            .select("target_id", "labels", "ts", "value")
            .iter_rows()
        }
        assert got == expected, metric
        # Every instant but the first, before the first scrapes answered.
        assert len({key[2] for key in got}) >= seconds - 1
    # The crashed replica has no values while down: its counter restarts after the gap.
    tokens = points.filter(
        (pl.col("metric") == "vllm:generation_tokens_total") & (pl.col("target_id") == crashed_id)
    ).sort("ts")
    assert (tokens["value"].diff() < 0).sum() == 1

    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    second = json.loads(again.stdout)
    assert (second["new_scrapes"], second["new_points"]) == (0, 0)
    for name, frame in _stored(db).items():
        assert frame.equals(tables[name]), name


# -- issue #5: rate and increase against Prometheus's own answers ------------------------------


@pytest.fixture(scope="module")
def raw_store(recording: Recording) -> Iterator[Store]:
    """The recording imported by the reader at its default resolution (the raw samples), in
    chunks of 7 scrapes."""
    window = ImportWindow(
        start=from_ms(recording.start_ms - 3_000),
        end=from_ms(recording.end_ms + 3_000),
        step_s=1.0,
        chunk_points=7,
    )
    assert window.resolution is Resolution.RAW
    with Store.open(":memory:") as store, httpx.Client() as client:
        api = PrometheusApi(client, recording.url)
        report = import_range(api, store=store, plan=plan_import(api, window=window))
        assert report.problems == []
        yield store


def _ours(
    store: Store, metric: str, *, function: str, range_s: float, instants_ms: list[int]
) -> tuple[dict[tuple[int, str, str], float], dict[tuple[int, str, str], float]]:
    """The frame form's answers and the scalar form's, keyed by (instant, target, labels)."""
    series = (
        store.read_series()
        .filter(pl.col("metric") == metric)
        .select("series_id", "target_id", "labels")
    )
    points = store.read_points().join(series, on="series_id", how="semi")
    compute = rate_frame if function == "rate" else increase_frame
    frame = (
        compute(points, range_s=range_s, window_ends_s=[t / 1000 for t in instants_ms])
        .join(series, on="series_id")
        .collect()
    )
    framed = {
        (round(end_s * 1000), target_id, labels): value
        for end_s, target_id, labels, value in frame.select(
            "window_end_s", "target_id", "labels", function
        ).iter_rows()
    }
    scalar = rate if function == "rate" else increase
    by_series = points.collect().group_by("series_id").agg("ts", "value")
    keys = {i: (t, lbl) for i, t, lbl in series.collect().iter_rows()}
    scalars: dict[tuple[int, str, str], float] = {}
    for series_id, stamps, values in by_series.iter_rows():
        samples = [(to_ms(ts) / 1000, v) for ts, v in zip(stamps, values, strict=True)]
        for at_ms in instants_ms:
            value = scalar(samples, range_start_s=at_ms / 1000 - range_s, range_end_s=at_ms / 1000)
            if value is not None:
                scalars[(at_ms, *keys[series_id])] = value
    return framed, scalars


def _theirs(
    rec: Recording, metric: str, *, function: str, range_s: int, instants_ms: list[int]
) -> dict[tuple[int, str, str], float]:
    out: dict[tuple[int, str, str], float] = {}
    for at_ms in instants_ms:
        expr = f"{function}({metric}[{range_s}s])"
        for item in instant_query(rec.client, expr, time_s=at_ms / 1000):
            labels = item["metric"]
            out[(at_ms, target_id_of(labels) or "", series_labels(labels))] = float(
                item["value"][1]
            )
    return out


@pytest.mark.parametrize("function", ["rate", "increase"])
@pytest.mark.parametrize("range_s", [5, 10])
def test_rate_and_increase_match_prometheus_across_a_replica_restart(
    recording: Recording, raw_store: Store, function: str, range_s: int
) -> None:
    # Every 0.75 s from one window after the start: on and between scrape instants.
    instants_ms = list(range(recording.start_ms + range_s * 1000, recording.end_ms - 1000 + 1, 750))
    (crashed_id,) = (
        raw_store.read_targets().filter(pl.col("replica") == CRASHED).collect()["target_id"]
    )
    across_reset = 0
    for metric in COUNTERS:
        theirs = _theirs(
            recording, metric, function=function, range_s=range_s, instants_ms=instants_ms
        )
        framed, scalars = _ours(
            raw_store, metric, function=function, range_s=range_s, instants_ms=instants_ms
        )
        assert set(framed) == set(theirs), metric
        assert set(scalars) == set(theirs), metric
        for key, expected in theirs.items():
            got = framed[key]
            assert math.isclose(got, expected, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-12), (
                metric,
                key,
                got,
                expected,
            )
        assert scalars == theirs, metric  # bit for bit
        # Windows in which Prometheus sees the restarted replica's counter reset, and which
        # were compared above.
        for at_ms in instants_ms:
            resets = instant_query(
                recording.client,
                f'max(resets({metric}{{replica="{CRASHED}"}}[{range_s}s]))',
                time_s=at_ms / 1000,
            )
            compared = any(at == at_ms and target == crashed_id for at, target, _ in theirs)
            if resets and float(resets[0]["value"][1]) > 0 and compared:
                across_reset += 1
    assert across_reset >= 2 * len(COUNTERS), "too few windows spanned the counter reset"
