"""The collector's own metrics (`servewatch_scrape_*`, `servewatch_job_*`, ...), in a registry of
their own that `run` serves on /metrics beside the fleet gauges."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SCRAPE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class SelfMetrics:
    """The service's own health, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.scrape_duration = Histogram(
            "servewatch_scrape_duration_seconds",
            "Time to scrape one target (fetch only).",
            buckets=SCRAPE_BUCKETS_S,
            registry=r,
        )
        self.scrape_lag = Histogram(
            "servewatch_scrape_lag_seconds",
            "How late a scrape started against its target's scheduled slot.",
            buckets=SCRAPE_BUCKETS_S,
            registry=r,
        )
        self.skipped_slots = Counter(
            "servewatch_scrape_skipped_slots",
            "Scheduled slots not scraped because the target's previous scrape was still running "
            "(or the loop woke more than an interval late).",
            registry=r,
        )
        self.scrape_targets = Gauge(
            "servewatch_scrape_targets", "Targets on the scrape schedule.", registry=r
        )
        self.targets_failing = Gauge(
            "servewatch_targets_failing",
            "Targets whose last scrape.failing_after scrapes all failed.",
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
