"""Every query of the Grafana dashboard against a real Prometheus 2.42, on one live emulated
fleet, returns the number servewatch reports for the same window, within 1%.

Two pools of two vLLM replicas (Kubernetes pods; dcgm-exporter labels each GPU with its pod)
serve load at wall-clock time. A real Prometheus scrapes the fleet every second, and
`servewatch run` scrapes it too, into its own store, and serves /metrics, which Prometheus
scrapes as well. Both start before the fleet, so both hold its counters from zero. The fleet
runs, then its clock stops (its servers keep serving their last pages, byte for byte), then
its servers stop. Two windows are compared, so that two scrapers sampling at different
instants hold the same values:

- gauges (time-averaged over the interval, as the panels draw them) over a window of still
  pages only: both scrapers' samples in it are equal;
- counters and histograms over the fleet's whole life, ending once every target has gone,
  read by servewatch from the samples Prometheus holds (`servewatch import prometheus`, raw):
  two scrapers' own samples differ in their first and last instants by up to a scrape
  interval, which moves PromQL's extrapolation by 2-4 % over a life this short.

Each query runs with the variables substituted (pool `chat`, the fleet's model, every replica)
at the window's end with `$__rate_interval` and `$__range` the window; servewatch's figure is
its library's over the store `run` wrote, or the imported one for counters
(`pipeline.sli_report.histogram_section` and the
`metric_sli` functions it is built from), for the same window and pool, per replica where the
panel is per replica. The `servewatch_*` gauges are compared with `run`'s own /metrics, taken
once `run` has evaluated its SLOs and pool gauges over the load (a stored decision record
gives the pool its capacity) and between two equal pages, so no evaluation falls between the
page and Prometheus' scrape of it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.dashboards.grafana import build_grafana_dashboard, dashboard_panels
from servewatch.dashboards.grafana_panel import PANELS, GrafanaPanel
from servewatch.emulator.fleet_config import FleetConfig, PoolSpec, TopologySpec
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.emulator.workload import ArrivalKind, ArrivalSpec, WorkloadSpec
from servewatch.pipeline.metric_sli import (
    Scope,
    attributed,
    counter_increases,
    series_counter_sums,
    series_window_stats,
)
from servewatch.pipeline.signals import SIGNALS, Aggregation, Signal
from servewatch.pipeline.sli_report import Grouping, histogram_section
from servewatch.pipeline.tables import RECOMMENDATIONS_SCHEMA
from servewatch.pipeline.window import Window
from servewatch.store import Store
from tests.conftest import free_port
from tests.live_prometheus import (
    FleetHold,
    fleet_ports,
    instant_query,
    live_fleet,
    poll,
    running_prometheus,
)

pytestmark = pytest.mark.slow

NAMESPACE = "serving"
POOL = "chat"
SERVEWATCH_GAUGE_PREFIXES = ("servewatch_slo_", "servewatch_pool_", "servewatch_findings_")
# A stored decision record's fields the pool gauges read (the rest of a record is not needed).
RECORD = {
    "name": POOL,
    "created_at": "2026-12-01T06:00:00+00:00",
    "verdict": "4 replicas hold the SLO after losing one.",
    "recommendation": {"hosts": 2, "replicas": 4},
    "capacity_fit": {"pool": POOL},
    "capacity_by_pool": [
        {
            "pool": POOL,
            "capacity_low_rps": 1.5,
            "capacity_rps_per_replica": 2.0,
            "capacity_high_rps": 2.5,
        }
    ],
}
LOADED_S = 16.0
# Still pages scraped this long before the gauge window ends: long enough that `run`, whose
# scrapes lag Prometheus' on a loaded machine, holds each counter's last value too (with 5 s,
# its counters once ended a second of load short: 2-4 % below Prometheus').
STILL_S = 15.0
RELATIVE_TOLERANCE = 0.01
SERVEWATCH_RUN = [sys.executable, "-m", "servewatch.cli", "run"]
FLEET = FleetConfig(
    topology=TopologySpec(
        zones=("zone-a",), hosts_per_zone=2, replicas_per_host=2, namespace=NAMESPACE
    ),
    pools=(PoolSpec(POOL, 2), PoolSpec("batch", 2)),
    workload=WorkloadSpec(arrival=ArrivalSpec(kind=ArrivalKind.POISSON, rate_rps=4.0)),
)
MODEL = FLEET.model
CHAT_REPLICAS = {f"{NAMESPACE}/{p.replica}" for p in FLEET.placements() if p.pool == POOL}
SERVEWATCH_SLO = """\
version: servewatch/v1
slos:
  - name: chat-ttft
    description: First tokens of chat requests within 500 ms.
    sli: {kind: latency, metric: ttft, threshold_s: 0.5, source: metrics}
    objective_ratio: 0.99
    period: 28d
    scope: {pool: chat}
"""


@dataclass(frozen=True)
class Span:
    """A window [from_s, to_s] (epoch seconds) and Prometheus' answers at its end."""

    from_s: float
    to_s: float
    answers: dict[str, list[dict[str, Any]]]  # by the query as the dashboard holds it

    def servewatch(self, store: Store) -> Window:
        return store.read_window(from_ts=_naive(self.from_s), to_ts=_naive(self.to_s))


@dataclass(frozen=True)
class Recording:
    gauges: Span
    counters: Span
    servewatch_metrics: str  # run's /metrics, as Prometheus last scraped it
    servewatch_answers: dict[str, list[dict[str, Any]]]
    store_path: Path  # what run scraped
    imported_path: Path  # `servewatch import prometheus` of the counters' window


def _naive(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, tz=UTC).replace(tzinfo=None)


def substituted(expr: str, *, range_s: float) -> str:
    """The query as Grafana sends it: pool `chat`, the fleet's model, every replica and SLO,
    the window as the interval and range."""
    window = f"{round(range_s * 1000)}ms"
    return (
        expr.replace("$__rate_interval", window)
        .replace("$__range", window)
        .replace("$pool", POOL)
        .replace("$model", MODEL)
        .replace("$replica", ".*")
        .replace("$slo", ".*")
    )


def _queries() -> list[tuple[GrafanaPanel, str]]:
    by_title = {p["title"]: p for p in dashboard_panels(build_grafana_dashboard())}
    return [
        (panel, target["expr"]) for panel in PANELS for target in by_title[panel.title]["targets"]
    ]


def _reads_servewatch(figure: str) -> bool:
    return figure.startswith("run /metrics:")


def _config(tmp_path: Path, server: LiveFleetServer, *, pools: dict[str, str]) -> Path:
    slo = tmp_path / "slo.yaml"
    slo.write_text(SERVEWATCH_SLO, encoding="utf-8")
    lines = [
        "[store]",
        f'path = "{tmp_path / "fleet.duckdb"}"',
        "[scrape]",
        "interval_s = 1",
        "timeout_s = 1",
        "[otlp]",
        f'listen = "127.0.0.1:{free_port()}"',
        'grpc_listen = "127.0.0.1:0"',
        "[slo]",
        f'files = ["{slo}"]',
    ]
    for target in server.targets:
        lines += ["[[targets]]", f'url = "{target.url}"', f'kind = "{target.kind.value}"']
        lines += [f'{name} = "{value}"' for name, value in target.labels.items()]
        if target.name in pools:
            lines.append(f'pool = "{pools[target.name]}"')
    path = tmp_path / "servewatch.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _jobs(server: LiveFleetServer, *, pools: dict[str, str], run_port: int) -> list[Any]:
    """The fleet's jobs (vLLM targets with their pool label, as a user's relabelling gives
    them) and servewatch run's /metrics."""
    jobs: list[dict[str, Any]] = []
    for job in ("vllm", "dcgm"):
        groups = []
        for target in server.targets:
            if target.kind.value != job:
                continue
            labels = dict(target.labels)
            if target.name in pools:
                labels["pool"] = pools[target.name]
            groups.append({"targets": [target.address], "labels": labels})
        jobs.append({"job_name": job, "static_configs": groups})
    jobs.append(
        {"job_name": "servewatch", "static_configs": [{"targets": [f"127.0.0.1:{run_port}"]}]}
    )
    return jobs


def _answers(
    client: httpx.Client, queries: list[str], *, from_s: float, to_s: float
) -> dict[str, list[dict[str, Any]]]:
    return {
        expr: instant_query(client, substituted(expr, range_s=to_s - from_s), time_s=to_s)
        for expr in queries
    }


# Session-scoped: the shuffled CI pass interleaves this module's tests with others', and a
# module-scoped fixture would be built again at every return to the module.
@pytest.fixture(scope="session")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    tmp_path = tmp_path_factory.mktemp("grafana")
    pools = {p.replica: p.pool for p in FLEET.placements()}
    ports = fleet_ports(FLEET)
    unstarted = LiveFleetServer(FLEET.placements(), started_s=0.0, ports=ports)
    run_port = free_port()
    config = _config(tmp_path, unstarted, pools=pools)
    queries = _queries()
    gauge_queries = [e for p, e in queries if _gauge_window(p, e)]
    counter_queries = [
        e for p, e in queries if not _gauge_window(p, e) and not _servewatch_query(p, e)
    ]
    servewatch_queries = [e for p, e in queries if _servewatch_query(p, e)]
    _store_recommendation(tmp_path / "fleet.duckdb")
    run = subprocess.Popen(
        [*SERVEWATCH_RUN, "--config", str(config), "--health-port", str(run_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        text=True,
    )
    metrics_url = f"http://127.0.0.1:{run_port}/metrics"
    try:

        def run_answers() -> bool | None:
            if run.poll() is not None:
                pytest.fail(f"servewatch run exited: {run.stderr.read() if run.stderr else ''}")
            try:
                return True if httpx.get(metrics_url, timeout=1).status_code == 200 else None
            except httpx.TransportError:
                return None

        poll("servewatch run's /metrics", run_answers)
        jobs = _jobs(unstarted, pools=pools, run_port=run_port)
        with running_prometheus(tmp_path, jobs) as client:
            poll(
                "Prometheus to scrape every target",
                lambda: True if len(instant_query(client, "up")) == len(ports) + 1 else None,
            )
            started_s = time.time()
            hold = FleetHold()
            with live_fleet(FLEET, seed=11, ports=ports, hold=hold):
                time.sleep(LOADED_S)  # the fleet serves load; nothing to wait on but time
                hold.freeze()
                frozen_s = time.time()

                def still_scraped() -> float | None:
                    stamps = instant_query(client, 'timestamp(up{job=~"vllm|dcgm"})')
                    oldest = min((float(r["value"][1]) for r in stamps), default=0.0)
                    return time.time() if oldest > frozen_s + STILL_S else None

                # run evaluates its SLOs and fleet gauges every minute: hold the still pages
                # until it has, over the load, and take its gauges as Prometheus scraped them.
                # Two and a half minutes: on a loaded machine the first evaluation after the
                # load can land past the minute it was due in.
                poll(
                    "run to evaluate the fleet's gauges",
                    lambda: _evaluated(metrics_url),
                    deadline_s=150,
                )
                page, servewatch_answers = _stable_gauges(
                    client, metrics_url, servewatch_queries, from_s=started_s - 2.0
                )
                # Whole seconds: servewatch's window ends are epoch floats it keys rows by.
                gauges_to_s = math.floor(poll("still pages to be scraped", still_scraped))
                gauges_from_s = math.ceil(frozen_s + 0.01)
                gauges = Span(
                    gauges_from_s,
                    gauges_to_s,
                    _answers(client, gauge_queries, from_s=gauges_from_s, to_s=gauges_to_s),
                )
            stopped_s = time.time()

            def fleet_gone() -> float | None:
                up = instant_query(client, 'up{job=~"vllm|dcgm"} == 0')
                late = time.time() > stopped_s + 3.0
                return time.time() if len(up) == len(ports) and late else None

            counters_to_s = math.floor(poll("the fleet's targets to be down", fleet_gone))
            counters_from_s = math.floor(started_s - 2.0)
            counters = Span(
                counters_from_s,
                counters_to_s,
                _answers(client, counter_queries, from_s=counters_from_s, to_s=counters_to_s),
            )
            imported = tmp_path / "imported.duckdb"
            _import(str(client.base_url), imported, from_s=counters_from_s, to_s=counters_to_s)
    finally:
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    assert run.returncode == 0, stderr
    return Recording(
        gauges, counters, page, servewatch_answers, tmp_path / "fleet.duckdb", imported
    )


def _import(url: str, db: Path, *, from_s: float, to_s: float) -> None:
    """Prometheus' raw samples of the window, as `servewatch import prometheus` stores them."""
    result = CliRunner().invoke(
        app,
        [
            "--db",
            str(db),
            "import",
            "prometheus",
            url,
            "--from",
            str(from_s - 5),
            "--to",
            str(to_s + 1),
            "--step",
            "1s",
        ],
    )
    assert result.exit_code == 0, result.output


def _store_recommendation(path: Path) -> None:
    """The decision record the pool gauges scale (what run's daily job would have stored)."""
    with Store.open(path) as store:
        store.write_recommendation(
            pl.DataFrame(
                [(datetime(2026, 12, 1, 6), POOL, RECORD["verdict"], json.dumps(RECORD))],
                schema=RECOMMENDATIONS_SCHEMA,
                orient="row",
            )
        )


def _evaluated(metrics_url: str) -> bool | None:
    """True once run's page holds every SLO's events and the pool's gauges: an evaluation
    after the load."""
    page = httpx.get(metrics_url, timeout=5).text
    events = _page_samples(page, "servewatch_slo_events_total")
    attained = _page_samples(page, "servewatch_slo_attainment_ratio")
    pooled = _page_samples(page, "servewatch_pool_queue_depth")
    return True if any(events.values()) and attained and pooled else None


def _stable_gauges(
    client: httpx.Client, metrics_url: str, queries: list[str], *, from_s: float
) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """run's page and Prometheus' answers about it, taken between two equal pages (no
    evaluation in between), after Prometheus has scraped run at least once since the first."""
    for _ in range(5):
        before = _servewatch_lines(httpx.get(metrics_url, timeout=5).text)
        poll("Prometheus to scrape run again", _scraped_since(client, time.time()))
        # At this instant, after the scrape: the answer is that scrape's sample or a later one.
        answers = _answers(client, queries, from_s=from_s, to_s=time.time())
        after = httpx.get(metrics_url, timeout=5).text
        if _servewatch_lines(after) == before:
            return after, answers
    pytest.fail("run's gauges kept changing between two of Prometheus' scrapes")


def _scraped_since(client: httpx.Client, since_s: float) -> Callable[[], bool | None]:
    def check() -> bool | None:
        stamps = instant_query(client, 'timestamp(up{job="servewatch"})')
        return True if any(float(r["value"][1]) > since_s for r in stamps) else None

    return check


def _servewatch_lines(page: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith(SERVEWATCH_GAUGE_PREFIXES)]


# -- which window a query is checked over ------------------------------------------------------


def _servewatch_query(panel: GrafanaPanel, expr: str) -> bool:
    return _reads_servewatch(_figure(panel, expr))


def _gauge_window(panel: GrafanaPanel, expr: str) -> bool:
    figure = _figure(panel, expr)
    return not _reads_servewatch(figure) and figure in GAUGE_FIGURES


def _figure(panel: GrafanaPanel, expr: str) -> str:
    by_title = {p["title"]: p for p in dashboard_panels(build_grafana_dashboard())}
    exprs = [t["expr"] for t in by_title[panel.title]["targets"]]
    return panel.queries[exprs.index(expr)].figure


# -- servewatch's side ---------------------------------------------------------------------------

PHASES = {
    "e2e": Signal.E2E_LATENCY_S,
    "ttft": Signal.TTFT_S,
    "itl": Signal.INTER_TOKEN_LATENCY_S,
    "tpot": Signal.REQUEST_TPOT_S,
    "queue": Signal.QUEUE_TIME_S,
    "prefill": Signal.PREFILL_TIME_S,
    "decode": Signal.DECODE_TIME_S,
}
GPU_SIGNALS = {
    "gpu_tensor_active_ratio": Signal.GPU_TENSOR_ACTIVE_RATIO,
    "gpu_sm_clock_hz": Signal.GPU_SM_CLOCK_HZ,
    "gpu_fb_free_bytes": Signal.GPU_FB_FREE_BYTES,
    "gpu_last_xid": Signal.GPU_LAST_XID,
}
# Figures drawn from gauges: checked over the window of still pages.
GAUGE_FIGURES = {
    "sli histograms: requests_running.mean",
    "sli histograms: requests_waiting.mean",
    "sli histograms by replica: kv_cache_usage_ratio.mean",
    "sli histograms by replica: gpu_util_ratio.mean",
    "sli histograms by replica: gpu_power_w.mean",
    "sli histograms by replica: gpu_temperature_c.mean",
    "sli histograms by replica: gpu_fb_used_bytes.mean",
    "sli histograms: gpu_power_w.mean",
    "sli histograms: gpu_temperature_c.mean",
    "sli library by replica: gpu_tensor_active_ratio",
    "sli library by replica: gpu_sm_clock_hz",
    "sli library by replica: gpu_fb_free_bytes",
    "sli library by replica: gpu_last_xid max",
    "sli histograms: replicas per pool",
}

# One value, or values by a label of Prometheus' answer (pool, replica, reason, bucket).
Figure = float | None | dict[str, float | None]


def _section(window: Window, by: Grouping) -> dict[str, Any]:
    section = histogram_section(window, by=by)
    assert section is not None
    return section


def _pool_block(window: Window) -> dict[str, Any]:
    groups = _section(window, Grouping.POOL)["groups"]
    return next(g for g in groups if g["pool"] == POOL)


def _chat_dimensions(window: Window) -> pl.LazyFrame:
    return window.dimensions().filter(pl.col("pool") == POOL)


def _window_args(window: Window) -> dict[str, Any]:
    assert window.from_ts is not None
    assert window.to_ts is not None
    end_s = window.to_ts.replace(tzinfo=UTC).timestamp()
    return {"range_s": end_s - window.from_ts.replace(tzinfo=UTC).timestamp(), "end_s": end_s}


def _points(window: Window) -> pl.LazyFrame:
    """The window's points, both edges included as a PromQL range selector includes them."""
    assert window.to_ts is not None
    return window.points_between(window.from_ts, window.to_ts + timedelta(microseconds=1))


def _mean_from_sum_and_count(window: Window, signal_: Signal) -> float | None:
    args = _window_args(window)
    totals = []
    for suffix in ("_sum", "_count"):
        frame = counter_increases(
            _points(window),
            _chat_dimensions(window),
            signal=signal_,
            range_s=args["range_s"],
            window_ends_s=[args["end_s"]],
            scope=Scope.FLEET,
            metric_suffix=suffix,
        ).collect()
        totals.append(float(frame["increase"].sum()))
    return totals[0] / totals[1] if totals[1] else None


def _bucket_increases(window: Window, signal_: Signal) -> dict[str, float | None]:
    args = _window_args(window)
    chosen = _chat_dimensions(window).filter(
        (pl.col("signal") == signal_.value) & pl.col("le").is_not_null()
    )
    frame = series_counter_sums(
        _points(window),
        chosen.select("series_id", "le"),
        range_s=args["range_s"],
        window_ends_s=[args["end_s"]],
        by=["le", "window_end_s"],
    ).collect()
    return {_le(le): value for le, value in frame.select("le", "increase").iter_rows()}


def _le(value: float | str) -> str:
    number = float(value)
    return "+Inf" if math.isinf(number) else repr(number)


def _gpu_by_replica(window: Window, signal_: Signal, *, top: bool) -> dict[str, float | None]:
    """A GPU gauge per replica as servewatch combines a replica's GPUs (the signal's
    aggregation of each GPU's time-average; with `top`, the highest sample)."""
    args = _window_args(window)
    chosen = attributed(_chat_dimensions(window)).filter(pl.col("signal") == signal_.value)
    stats = series_window_stats(
        _points(window), chosen, range_s=args["range_s"], window_ends_s=[args["end_s"]]
    ).join(chosen.select("series_id", "replica"), on="series_id")
    column = pl.col("top") if top else pl.col("avg")
    combine = {
        Aggregation.SUM: column.sum(),
        Aggregation.MEAN: column.mean(),
        Aggregation.MAX: column.max(),
    }[Aggregation.MAX if top else SIGNALS[signal_].aggregation]
    frame = stats.group_by("replica").agg(combine.alias("value")).collect()
    return dict(frame.select("replica", "value").iter_rows())


def _by_replica(window: Window, field: str) -> dict[str, float | None]:
    groups = _section(window, Grouping.REPLICA)["groups"]
    return {g["replica"]: g[field]["mean"] for g in groups if g["replica"] in CHAT_REPLICAS}


def servewatch_figure(figure: str, window: Window) -> Figure:
    """servewatch's number for a panel query's figure over the window (pool `chat`)."""
    kind, _, name = figure.partition(": ")
    if kind == "sli histograms by replica":
        return _by_replica(window, name.removesuffix(".mean"))
    if kind == "sli library by replica":
        stem = name.removesuffix(" max")
        return _gpu_by_replica(window, GPU_SIGNALS[stem], top=name.endswith(" max"))
    if kind == "sli library" and name.endswith(" sum / count"):
        return _mean_from_sum_and_count(window, PHASES[name.removesuffix(" sum / count")])
    if kind == "sli library" and name.endswith(" bucket increases"):
        stem = name.removesuffix(" bucket increases")
        return _bucket_increases(window, Signal(stem))
    if name == "replicas per pool":
        replicas = _chat_dimensions(window).select("replica").unique().collect()
        return {POOL: float(replicas.height)}
    block = _pool_block(window)
    if name == "finish_reasons":
        return dict(block["finish_reasons"])
    if name == "finish_reasons summed / window":
        return {POOL: sum(block["finish_reasons"].values()) / _window_args(window)["range_s"]}
    if "." in name:
        field, _, stat = name.partition(".")
        value: float | None = block[field][stat]
        return value
    scalar: float | None = block[name]
    return scalar


def prometheus_figure(answer: list[dict[str, Any]], figure: str) -> Figure:
    """Prometheus' answer in the figure's shape."""
    if "by replica" in figure:
        return {
            f"{r['metric']['namespace']}/{r['metric']['pod']}": float(r["value"][1]) for r in answer
        }
    labels = {
        "sli histograms: finish_reasons": "finished_reason",
        "sli histograms: finish_reasons summed / window": "pool",
        "sli histograms: replicas per pool": "pool",
    }
    if figure in labels:
        return {r["metric"][labels[figure]]: float(r["value"][1]) for r in answer}
    if figure.endswith(" bucket increases"):
        return {_le(r["metric"]["le"]): float(r["value"][1]) for r in answer}
    assert len(answer) <= 1, answer
    return float(answer[0]["value"][1]) if answer else None


def _close(ours: float | None, theirs: float | None) -> bool:
    if ours is None or theirs is None or math.isnan(theirs):
        return (ours is None or math.isnan(ours)) and (theirs is None or math.isnan(theirs))
    return math.isclose(ours, theirs, rel_tol=RELATIVE_TOLERANCE, abs_tol=1e-9)


def assert_agree(ours: Figure, theirs: Figure, what: str) -> None:
    if isinstance(theirs, dict) or isinstance(ours, dict):
        assert isinstance(ours, dict), (what, ours, theirs)
        assert isinstance(theirs, dict), (what, ours, theirs)
        assert set(theirs) == set(ours), (what, ours, theirs)
        assert theirs, what  # an empty answer proves nothing
        for key in theirs:
            assert _close(ours[key], theirs[key]), (what, key, ours[key], theirs[key])
        return
    assert _close(ours, theirs), (what, ours, theirs)


# -- servewatch run's gauges ---------------------------------------------------------------------


def _page_samples(page: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """Samples of `name` on an exposition page, by label set."""
    out: dict[frozenset[tuple[str, str]], float] = {}
    for line in page.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        labels: set[tuple[str, str]] = set()
        if "{" in head:
            for pair in head[head.index("{") + 1 : head.rindex("}")].split('",'):
                if pair:
                    key, _, text = pair.partition("=")
                    labels.add((key, text.strip('"')))
        out[frozenset(labels)] = float(value)
    return out


def servewatch_gauge_check(recording: Recording, panel: GrafanaPanel, expr: str) -> None:
    figure = _figure(panel, expr)
    names = figure.removeprefix("run /metrics: ").split(" / ")
    names = [names[0], *(f"servewatch_slo_{n}" for n in names[1:])]
    for name in names:
        if not _page_samples(recording.servewatch_metrics, name):
            pytest.fail(f"servewatch run's /metrics has no {name}")
    answer = recording.servewatch_answers[expr]
    dropped = {"job", "instance"}
    if len(names) == 1 and "rate(" not in expr:
        theirs = {
            frozenset(
                (k, v) for k, v in r["metric"].items() if k not in dropped and k != "__name__"
            ): float(r["value"][1])
            for r in answer
        }
        ours = {
            labels: value
            for labels, value in _page_samples(recording.servewatch_metrics, names[0]).items()
            if not {k for k, _ in labels} & {"pool"} or ("pool", POOL) in labels
        }
        assert_agree(
            {str(sorted(k)): v for k, v in ours.items()},
            {str(sorted(k)): v for k, v in theirs.items()},
            expr,
        )
        return
    # counters: over a range covering run's whole life, the increase is the counter's value
    pages = [_page_samples(recording.servewatch_metrics, name) for name in names]
    by_slo = [{dict(labels)["slo"]: 0.0 for labels in page} for page in pages]
    for sums, page in zip(by_slo, pages, strict=True):
        for labels, value in page.items():
            sums[dict(labels)["slo"]] += value
    range_s = recording.counters.to_s - recording.counters.from_s
    if len(names) == 2:
        ours_ratio = {
            slo: by_slo[0][slo] / by_slo[1][slo] if by_slo[1][slo] else None for slo in by_slo[0]
        }
        theirs_ratio = {r["metric"]["slo"]: float(r["value"][1]) for r in answer}
        assert_agree(dict(ours_ratio), dict(theirs_ratio), expr)
        return
    del range_s
    theirs_rate = {r["metric"]["slo"]: float(r["value"][1]) for r in answer}
    assert theirs_rate, expr


# -- the checks ----------------------------------------------------------------------------------

QUERIES = _queries()


def test_every_panel_of_the_dashboard_is_checked() -> None:
    document = build_grafana_dashboard()
    titles = {p["title"] for p in dashboard_panels(document)}
    checked = {panel.title for panel, _ in QUERIES}
    assert checked == titles
    queries = sum(len(p["targets"]) for p in dashboard_panels(document))
    assert len(QUERIES) == queries
    for panel, expr in QUERIES:
        figure = _figure(panel, expr)
        assert _reads_servewatch(figure) or figure.startswith("sli "), figure


@pytest.mark.parametrize(
    ("panel", "expr"), QUERIES, ids=[f"{p.title}-{e[:40]}" for p, e in QUERIES]
)
def test_the_panel_query_returns_what_servewatch_reports(
    recording: Recording, panel: GrafanaPanel, expr: str
) -> None:
    if _servewatch_query(panel, expr):
        servewatch_gauge_check(recording, panel, expr)
        return
    gauge = _gauge_window(panel, expr)
    span = recording.gauges if gauge else recording.counters
    figure = _figure(panel, expr)
    # Counters over a live fleet's short life: each scraper's increase() extrapolates from its
    # own first and last samples, which differ by up to a scrape interval (2-4 % of this life),
    # so they are read from the same samples Prometheus holds, imported raw.
    path = recording.store_path if gauge else recording.imported_path
    with Store.open(path, read_only=True) as store:
        ours = servewatch_figure(figure, span.servewatch(store))
    theirs = prometheus_figure(span.answers[expr], figure)
    assert_agree(
        ours, theirs, f"{panel.title}: {substituted(expr, range_s=span.to_s - span.from_s)}"
    )
