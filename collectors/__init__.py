"""Talking to sources: decoding wire formats and reading them into the store.

Collectors turn what a fleet emits (OTLP spans, Prometheus expositions) into rows of the
store's canonical tables; they compute no SLIs. By concern: `metrics/` (exposition,
catalogues, page ingest), `scrape/`, `traces/` (OTLP), `prometheus/` (its HTTP API) and
`fixture/` (recorded folders); the store's single writer and the service API client here.
"""

from servewatch.collectors.fixture.replay import replay_fixture
from servewatch.collectors.metrics.ingest import ingest_pages
from servewatch.collectors.scrape.loop import ScrapeLoop
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.service_api import fetch_document, fetch_window
from servewatch.collectors.store_writer import StoreWriter
from servewatch.collectors.traces.grpc_receiver import OtlpGrpcReceiver
from servewatch.collectors.traces.ingest import ingest_trace_files
from servewatch.collectors.traces.receiver import OtlpHttpReceiver

__all__ = [
    "OtlpGrpcReceiver",
    "OtlpHttpReceiver",
    "ScrapeLoop",
    "StoreWriter",
    "Target",
    "TargetKind",
    "fetch_document",
    "fetch_window",
    "ingest_pages",
    "ingest_trace_files",
    "replay_fixture",
]
