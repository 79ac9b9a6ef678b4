"""`servewatch run`: the scheduled service next to a fleet.

Scraping runs on its own event loop thread (collectors/scrape/loop.py): every target on its own
interval at a stable offset, never overlapping its own next scrape, a slow or dead target
delaying no other; pages reach the store in batches. APScheduler 3 runs the other jobs: targets
(every 30 s: file_sd re-read, this shard's targets kept, the scrape loop's targets and
schedules brought up to date), SLO
evaluation with notification (every minute), configuration reload (every 30 s; an invalid file
is logged and counted and the last good configuration keeps the data path running), retention
(hourly). Every store access goes through the single writer thread. The OTLP receivers (HTTP,
and gRPC unless `[otlp] grpc = false`) run on their own threads and match spans to the targets
the targets job last resolved. The service's own metrics (scrape lag and skipped slots among
them) and `/healthz` are served on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import polars as pl
from apscheduler.schedulers.background import BackgroundScheduler

from servewatch.api_routes import ApiRoutes
from servewatch.capacity.parallel import process_map
from servewatch.capacity.requirement import load_requirement
from servewatch.collectors.metrics.ingest import MetricIngestReport
from servewatch.collectors.scrape.loop import ScrapeLoop, ScrapeOutcome
from servewatch.collectors.scrape.shards import Shard
from servewatch.collectors.scrape.targets import Target
from servewatch.collectors.store_writer import StoreWriter, TraceCommit
from servewatch.collectors.traces.grpc_receiver import OtlpGrpcReceiver
from servewatch.collectors.traces.ingest import Reject
from servewatch.collectors.traces.receiver import OtlpHttpReceiver
from servewatch.collectors.traces.span_identity import TargetDirectory
from servewatch.config import Config, ConfigError, load_config
from servewatch.dashboards.export import write_report
from servewatch.fleet_gauges import (
    EventCounters,
    FleetGaugeCollector,
    FleetGaugeSnapshot,
    SloGauges,
    findings_active,
    pool_gauges,
    slo_gauges,
)
from servewatch.health_service import evaluate_findings
from servewatch.live_page import BuiltPage, LivePage, build_page, page_key
from servewatch.pipeline.request_sli import GoodputLimits
from servewatch.pipeline.tables import RECOMMENDATIONS_SCHEMA
from servewatch.pipeline.window import WindowQuery, window_to_bytes
from servewatch.recommend_service import recommend_from_store
from servewatch.report_service import store_report
from servewatch.scraping import (
    PageBatcher,
    TargetHealth,
    TargetResolver,
    page_of,
    scheduled_targets,
    shard_targets,
)
from servewatch.self_metrics import SelfMetrics
from servewatch.service_http import ServiceApi, serve_health
from servewatch.slo.alert_state import changes_from_frame
from servewatch.slo.alertmanager import AlertmanagerNotifier
from servewatch.slo.finding_alerts import FindingEvaluation
from servewatch.slo.spec import SloSpec
from servewatch.slo.status import slo_status
from servewatch.slo_service import evaluate, load_specs, slo_minutes_at
from servewatch.store import (
    IN_MEMORY,
    Holder,
    Store,
    remove_holder,
    roll_up_request_minutes,
    utc_now,
    write_holder,
)

log = logging.getLogger("servewatch.run")
JOB_DEFAULTS = {"max_instances": 1, "coalesce": True, "misfire_grace_time": 30}
TARGETS_EVERY_S = 30.0
# A window of a day of a big fleet is read in seconds; beyond this the API answers 503.
WINDOW_TIMEOUT_S = 120.0

__all__ = ["SelfMetrics", "Service", "serve_health"]


def _slo_specs(config: Config) -> tuple[SloSpec, ...]:
    """The SLOs the configuration names; none when it names no SLO files."""
    return load_specs(list(config.slo.files))[0] if config.slo.files else ()


class ScrapeRecorder:
    """The scrape loop's observer: lag, duration and skipped slots into the self-metrics,
    each result to the targets' health, pages to the store writer in batches."""

    def __init__(self, metrics: SelfMetrics, pages: PageBatcher, health: TargetHealth) -> None:
        self.metrics = metrics
        self.pages = pages
        self.health = health

    def scraped(self, outcome: ScrapeOutcome) -> None:
        self.metrics.scrape_lag.observe(outcome.lag_s)
        self.metrics.scrape_duration.observe(outcome.result.duration_s)
        self.health.record(outcome.result)
        self.pages.add(page_of(outcome.result))

    def skipped(self, target: Target, slots: int) -> None:
        self.metrics.skipped_slots.inc(slots)
        log.warning(
            "scrape of %s skipped %d slot(s): its previous scrape ran on", target.url, slots
        )


class CountingSink:
    """The receiver's sink: counts what arrives, then hands it to the store writer."""

    def __init__(self, writer: StoreWriter, metrics: SelfMetrics) -> None:
        self.writer = writer
        self.metrics = metrics

    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> TraceCommit:
        self.metrics.spans.inc(rows.height)
        self.metrics.spans_rejected.inc(len(rejects))
        return self.writer.submit(rows, rejects)


@dataclass
class ServiceState:
    config: Config
    specs: tuple[SloSpec, ...]
    loaded_at: float = field(default_factory=time.time)


class Service:
    def __init__(
        self,
        config_path: Path,
        *,
        store_path: Path | None = None,
        now: Callable[[], float] = time.time,
        shard: Shard | None = None,
    ) -> None:
        self.config_path = config_path
        # The --shard option outlives reloads: the file's scrape.shard never replaces it.
        self.shard = shard
        config = load_config(config_path, shard=shard)
        specs = _slo_specs(config)
        self.state = ServiceState(config=config, specs=specs)
        self.metrics = SelfMetrics()
        self.store = Store.open(store_path or config.store_path)
        self.writer = StoreWriter(self.store, on_error=self._writer_error)
        # Replaced whole by the targets job; the receivers' threads read whichever is current.
        self.target_directory = TargetDirectory.from_targets(config.targets)
        sink = CountingSink(self.writer, self.metrics)
        try:
            self.receiver = OtlpHttpReceiver(config.otlp, sink, targets=self._targets)
        except OSError:
            self._close_store()
            raise
        self.grpc_receiver: OtlpGrpcReceiver | None = None
        if config.otlp.grpc_enabled:
            try:
                self.grpc_receiver = OtlpGrpcReceiver(config.otlp, sink, targets=self._targets)
            except OSError:
                self.receiver.stop()
                self._close_store()
                raise
        self.resolver = TargetResolver()
        self.pages = PageBatcher(
            self.writer,
            keep_uncatalogued=lambda: self.state.config.scrape.keep_uncatalogued,
            drop=lambda: self.state.config.scrape.drop,
            on_report=self._ingested,
        )
        self.target_health = TargetHealth(failing_after=config.scrape.failing_after)
        self.metrics.targets_failing.set_function(self.target_health.failing_count)
        self.scrape_loop = ScrapeLoop(
            ScrapeRecorder(self.metrics, self.pages, self.target_health), now=now
        )
        self.scheduler = BackgroundScheduler(job_defaults=JOB_DEFAULTS, timezone="UTC")
        self.http_client = httpx.Client(timeout=10)
        self._health_server: ThreadingHTTPServer | None = None
        self.fleet_gauges = FleetGaugeCollector()
        self.metrics.registry.register(self.fleet_gauges)
        self.event_counters = EventCounters()
        self.page = LivePage(self._build_page)
        self.routes = ApiRoutes(
            call=self._read_store,
            specs=lambda: self.state.specs,
            target_health=self.target_health,
            now_s=now,
        )

    def _targets(self) -> TargetDirectory:
        return self.target_directory

    def _close_store(self) -> None:
        """A listener could not bind: nothing started, and the store is left for others."""
        self.writer.close()
        self.store.close()

    def _ingested(self, report: MetricIngestReport) -> None:
        self.metrics.samples.inc(report.stored_samples)
        self.metrics.malformed.inc(len(report.line_errors))
        self.metrics.failed_scrapes.inc(len(report.failed_scrapes))

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

    def sync_targets(self) -> None:
        """Bring the scrape loop's targets and schedules up to date with the configuration
        and the file_sd files: this shard's targets only, chosen afresh from the whole list."""
        targets, problems = self.resolver.resolve(self.state.config)
        for problem in problems:
            log.warning("targets: %s", problem)
        settings = self.state.config.scrape
        selection = shard_targets(targets, settings)
        self.target_health.failing_after = settings.failing_after
        self.target_health.follow(selection)
        # Spans are matched against every listed target: OTLP is not sharded, and a replica
        # exports to whichever collector it is pointed at, whoever scrapes it.
        self.target_directory = TargetDirectory.from_targets(targets)
        self.scrape_loop.set_targets(scheduled_targets(selection.kept, settings))
        self.metrics.scrape_targets.set(self.scrape_loop.target_count)

    def evaluate_once(self, now: datetime | None = None) -> None:
        specs = self.state.specs
        url = self.state.config.slo.alertmanager_url
        notifier = AlertmanagerNotifier(self.http_client, url=url) if url else None
        at = now or utc_now()

        def run(store: Store) -> None:
            # The service is the store's writer: it keeps the rollups current, and readers
            # (the report, `servewatch sli` through the API) read them as they are.
            roll_up_request_minutes(store)
            if specs:
                result = evaluate(store, specs=specs, at=at, notifier=notifier)
                if result.notification_error:
                    log.error("alert notification failed: %s", result.notification_error)
            # Fleet-health findings become tickets through the same notifier.
            findings = evaluate_findings(store, at=at, notifier=notifier, specs=specs)
            if findings.notification_error:
                log.error("finding alert notification failed: %s", findings.notification_error)
            # The page first: a failure computing the gauges leaves it knowing the store moved.
            self.page.moved(page_key(store))
            self.fleet_gauges.update(
                self._gauge_snapshot(store, specs=specs, at=at, findings=findings)
            )

        self.writer.submit_task(run)

    def _gauge_snapshot(
        self,
        store: Store,
        *,
        specs: tuple[SloSpec, ...],
        at: datetime,
        findings: FindingEvaluation,
    ) -> FleetGaugeSnapshot:
        """The figures `/metrics` serves until the next evaluation (see fleet_gauges)."""
        slos: tuple[SloGauges, ...] = ()
        if specs:
            minutes = slo_minutes_at(store, specs=specs, at=at).collect()
            history = changes_from_frame(store.read_alert_changes().collect())
            statuses = slo_status(minutes.lazy(), specs=specs, at=at, history=history)
            counted = self.event_counters.add(minutes, specs=specs, at=at)
            slos = slo_gauges(statuses, counted)
        return FleetGaugeSnapshot(
            at=at,
            slos=slos,
            pools=pool_gauges(store, at=at),
            findings_active=findings_active(findings),
        )

    def _read_store(self, task: Callable[[Store], Any]) -> Any:
        """`task` run on the writer's thread between writes: how the API reads the store."""
        return self.writer.call(task, timeout_s=WINDOW_TIMEOUT_S)

    def _build_page(self, key: Hashable) -> BuiltPage:
        specs = self.state.specs
        page: BuiltPage = self._read_store(lambda store: build_page(store, key=key, specs=specs))
        return page

    def reload_config(self) -> None:
        try:
            config = load_config(self.config_path, shard=self.shard)
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
            roll_up_request_minutes(store)
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
            roll_up_request_minutes(store)
            with process_map() as mapper:
                record, _ = recommend_from_store(store, requirement=requirement, mapper=mapper)
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
        if self.grpc_receiver is not None:
            self.grpc_receiver.start()
        self.scrape_loop.start()
        self.sync_targets()
        first = datetime.now().astimezone()
        jobs: list[tuple[str, Callable[[], None], dict[str, float]]] = [
            ("targets", self.sync_targets, {"seconds": TARGETS_EVERY_S}),
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
        api = ServiceApi(
            read_window=self.read_window, answer=self.routes.answer, page=self.page.page
        )
        self._health_server = serve_health(
            self.metrics,
            self.target_health,
            port=health_port,
            api=api,
            bearer_token=self.state.config.api.bearer_token,
        )
        if self.store.path != IN_MEMORY:
            # Readers of the store find the service, and where it answers, by this note.
            holder = Holder(os.getpid(), "servewatch run", api_url=self.api_url)
            write_holder(self.store.path, holder)

    @property
    def api_url(self) -> str | None:
        """Where the page, the API and /metrics answer, once started."""
        if self._health_server is None:
            return None
        return f"http://127.0.0.1:{self._health_server.server_address[1]}"

    def read_window(self, query: WindowQuery) -> bytes:
        """A store window for the local API, read on the writer's thread between writes."""
        return window_to_bytes(self._read_store(lambda store: store.read_query(query)))

    def stop(self) -> None:
        """Finish the running jobs, flush every pending write, close everything."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        self.scrape_loop.stop()
        self.pages.close()
        self.receiver.stop()
        if self.grpc_receiver is not None:
            self.grpc_receiver.stop()
        if self._health_server is not None:
            if self.store.path != IN_MEMORY:
                remove_holder(self.store.path, pid=os.getpid())
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
