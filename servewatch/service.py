"""`servewatch run`: the scheduled service next to a fleet.

APScheduler 3 runs the jobs; every store access goes through the single writer thread. Jobs:
scrape (every scrape interval), rollup and SLO evaluation with notification (every minute),
configuration reload (every 30 s; an invalid file is logged and counted and the last good
configuration keeps the data path running), retention (hourly). The OTLP receiver runs on its
own thread. The service's own metrics and `/healthz` are served on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import polars as pl
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from capacity.requirement import load_requirement
from collectors.metric_ingest import ingest_pages
from collectors.otlp_receiver import OtlpHttpReceiver
from collectors.store_writer import StoreWriter
from collectors.trace_ingest import Reject
from dashboards.export import write_report
from pipeline.request_sli import GoodputLimits
from pipeline.store import Store, utc_now
from pipeline.tables import RECOMMENDATIONS_SCHEMA
from servewatch.config import Config, ConfigError, load_config
from servewatch.recommend_service import recommend_from_store
from servewatch.report_service import store_report
from servewatch.scraping import fetch_results, page_of, resolve_targets
from servewatch.slo_service import evaluate, load_specs
from slo.alertmanager import AlertmanagerNotifier
from slo.spec import SloSpec

log = logging.getLogger("servewatch.run")
JOB_DEFAULTS = {"max_instances": 1, "coalesce": True, "misfire_grace_time": 30}


class SelfMetrics:
    """The service's own health, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scrape_duration = Histogram(
            "servewatch_scrape_round_duration_seconds",
            "Time to scrape all targets once.",
            registry=r,
        )
        self.samples = Counter("servewatch_samples_ingested", "Samples stored.", registry=r)
        self.malformed = Counter(
            "servewatch_malformed_lines", "Exposition lines left out.", registry=r
        )
        self.failed_scrapes = Counter(
            "servewatch_failed_scrapes", "Scrapes that got no page.", registry=r
        )
        self.spans = Counter("servewatch_spans_ingested", "Request spans stored.", registry=r)
        self.spans_rejected = Counter(
            "servewatch_spans_rejected", "Spans refused as unusable.", registry=r
        )
        self.job_duration = Histogram(
            "servewatch_job_duration_seconds", "Job run time.", ["job"], registry=r
        )
        self.job_failures = Counter(
            "servewatch_job_failures", "Jobs that raised.", ["job"], registry=r
        )
        self.job_last_success = Gauge(
            "servewatch_job_last_success_timestamp_seconds",
            "Last successful run.",
            ["job"],
            registry=r,
        )
        self.config_errors = Counter(
            "servewatch_config_reload_errors", "Config reloads that failed.", registry=r
        )
        self.config_age = Gauge(
            "servewatch_config_age_seconds",
            "Age of the configuration in use (grows while reloads fail).",
            registry=r,
        )


def _slo_specs(config: Config) -> tuple[SloSpec, ...]:
    """The SLOs the configuration names; none when it names no SLO files."""
    return load_specs(list(config.slo.files))[0] if config.slo.files else ()


class CountingSink:
    """The receiver's sink: counts what arrives, then hands it to the store writer."""

    def __init__(self, writer: StoreWriter, metrics: SelfMetrics) -> None:
        self.writer = writer
        self.metrics = metrics

    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> None:
        self.metrics.spans.inc(rows.height)
        self.metrics.spans_rejected.inc(len(rejects))
        self.writer.submit(rows, rejects)


@dataclass
class ServiceState:
    config: Config
    specs: tuple[SloSpec, ...]
    loaded_at: float = field(default_factory=time.time)


class Service:
    def __init__(self, config_path: Path, *, store_path: Path | None = None) -> None:
        self.config_path = config_path
        config = load_config(config_path)
        specs = _slo_specs(config)
        self.state = ServiceState(config=config, specs=specs)
        self.metrics = SelfMetrics()
        self.store = Store.open(store_path or config.store_path)
        self.writer = StoreWriter(self.store, on_error=self._writer_error)
        self.receiver = OtlpHttpReceiver(config.otlp, CountingSink(self.writer, self.metrics))
        self.scheduler = BackgroundScheduler(job_defaults=JOB_DEFAULTS, timezone="UTC")
        self.http_client = httpx.Client(timeout=10)
        self._health_server: ThreadingHTTPServer | None = None

    def _writer_error(self, exc: Exception) -> None:
        log.error("store write failed: %s", exc)
        self.metrics.job_failures.labels("store_write").inc()

    # -- jobs -----------------------------------------------------------------------------

    def _timed(self, name: str, job: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            started = time.perf_counter()
            try:
                job()
            except Exception:
                self.metrics.job_failures.labels(name).inc()
                log.exception("job %s failed", name)
                return
            finally:
                self.metrics.job_duration.labels(name).observe(time.perf_counter() - started)
            self.metrics.job_last_success.labels(name).set(time.time())

        return run

    def scrape_once(self) -> None:
        targets, problems = resolve_targets(self.state.config)
        for problem in problems:
            log.warning("targets: %s", problem)
        if not targets:
            return
        started = time.perf_counter()
        results = asyncio.run(fetch_results(targets, self.state.config.scrape))
        self.metrics.scrape_duration.observe(time.perf_counter() - started)
        pages = [page_of(r) for r in results]
        keep = self.state.config.scrape.keep_uncatalogued

        def write(store: Store) -> None:
            report = ingest_pages(pages, store=store, keep_uncatalogued=keep)
            self.metrics.samples.inc(report.stored_samples)
            self.metrics.malformed.inc(len(report.line_errors))
            self.metrics.failed_scrapes.inc(len(report.failed_scrapes))

        self.writer.submit_task(write)

    def evaluate_once(self, now: datetime | None = None) -> None:
        specs = self.state.specs
        if not specs:
            return
        url = self.state.config.slo.alertmanager_url
        notifier = AlertmanagerNotifier(self.http_client, url=url) if url else None
        at = now or utc_now()

        def run(store: Store) -> None:
            result = evaluate(store, specs=specs, at=at, notifier=notifier)
            if result.notification_error:
                log.error("alert notification failed: %s", result.notification_error)

        self.writer.submit_task(run)

    def reload_config(self) -> None:
        try:
            config = load_config(self.config_path)
            specs = _slo_specs(config)
        except (ConfigError, ValueError) as exc:
            self.metrics.config_errors.inc()
            # A bad file is an expected event here, not a crash: one line, no traceback.
            log.error("configuration reload failed, keeping the last good one: %s", exc)  # noqa: TRY400
        else:
            self.state = ServiceState(config=config, specs=specs)
        self.metrics.config_age.set(time.time() - self.state.loaded_at)

    def report_once(self) -> None:
        """Export the offline report (HTML and specs; images are left to `servewatch report`,
        since rendering them would hold the writer for long)."""
        out = self.state.config.jobs.report_dir
        if out is None:
            return

        def export(store: Store) -> None:
            files = write_report(store_report(store, limits=GoodputLimits()), out, images=False)
            log.info("report written to %s", files.html)

        self.writer.submit_task(export)

    def recommend_once(self, now: datetime | None = None) -> None:
        path = self.state.config.jobs.requirement
        if path is None:
            return
        requirement = load_requirement(path)
        at = now or utc_now()

        def decide(store: Store) -> None:
            record, _ = recommend_from_store(store, requirement=requirement)
            store.write_recommendation(
                pl.DataFrame(
                    [(at, requirement.name, record.verdict(), json.dumps(record.to_json()))],
                    schema=RECOMMENDATIONS_SCHEMA,
                    orient="row",
                )
            )
            log.info("recommendation: %s", record.verdict())

        self.writer.submit_task(decide)

    def retention_once(self, *, keep_days: float = 14.0) -> None:
        cutoff = utc_now() - timedelta(days=keep_days)

        def drop(store: Store) -> None:
            dropped = store.drop_points_before(cutoff)
            log.info("retention dropped %d points before %s", dropped, cutoff)

        self.writer.submit_task(drop)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, *, health_port: int = 9464) -> None:
        self.receiver.start()
        interval_s = self.state.config.scrape.interval_s
        first = datetime.now().astimezone()
        jobs: list[tuple[str, Callable[[], None], dict[str, float]]] = [
            ("scrape", self.scrape_once, {"seconds": interval_s}),
            ("slo", self.evaluate_once, {"minutes": 1}),
            ("config", self.reload_config, {"seconds": 30}),
            ("retention", self.retention_once, {"hours": 1}),
        ]
        for name, job, every in jobs:
            self.scheduler.add_job(
                self._timed(name, job), "interval", id=name, next_run_time=first, **every
            )
        settings = self.state.config.jobs
        if settings.report_dir is not None:
            self.scheduler.add_job(
                self._timed("report", self.report_once),
                "interval",
                id="report",
                minutes=settings.report_every_minutes,
            )
        if settings.requirement is not None:
            hour, minute = settings.recommend_at_utc.split(":")
            self.scheduler.add_job(
                self._timed("recommend", self.recommend_once),
                "cron",
                id="recommend",
                hour=int(hour),
                minute=int(minute),
            )
        self.scheduler.start()
        self._health_server = _serve_health(self.metrics, port=health_port)

    def stop(self) -> None:
        """Finish the running jobs, flush every pending write, close everything."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self.receiver.stop()
        if self._health_server is not None:
            self._health_server.shutdown()
            self._health_server.server_close()
        self.writer.close()
        self.http_client.close()
        self.store.close()

    def run_until(self, stop: threading.Event, *, health_port: int = 9464) -> None:
        try:
            self.start(health_port=health_port)
            stop.wait()
        finally:
            self.stop()


def _serve_health(metrics: SelfMetrics, *, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                body, content_type = b"ok\n", "text/plain"
            elif self.path == "/metrics":
                body, content_type = generate_latest(metrics.registry), CONTENT_TYPE_LATEST
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
