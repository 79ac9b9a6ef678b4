"""Scrape cost per sample: servewatch's scrape path against a real Prometheus, same endpoints.

Endpoints: `REPLICAS` HTTP servers on 127.0.0.1, each serving vLLM V1 `/metrics` pages built
with prometheus_client from vLLM's names and buckets (`bench.parse_exposition.vllm_page`,
~270 sample lines, `_created` included); each endpoint cycles through a few pages whose values
differ, so consecutive scrapes append changed values, as a busy replica's would.
They answer HTTP/1.1 and keep connections alive, as vLLM's server does (`SCRAPE_COST_HTTP=1.0`:
HTTP/1.0, each connection closed after its answer, as they did before the scrape client).

Same CPU conditions: the endpoints are served by a child process pinned to one core; Prometheus
and this process (ours) are pinned together to the other core, so both scrapers share one core
and the same competition from the rest of the machine. Every figure is per sample line
(Prometheus's own count, `scrape_samples_scraped`), in nanoseconds, lower is better.

- peer: Prometheus 2.42 scraping every endpoint every second for the whole run. Wall: the
  median over its scrapes of scrape_duration_seconds / scrape_samples_scraped, read from its
  HTTP API; that duration covers the fetch, the parse and the append to its head. CPU: its
  process's CPU time (/proc) over the window of each mode of ours, over the samples it scraped
  in that window.
- servewatch, in the same run on the same endpoints, two ways the product scrapes:
  - service (`servewatch run`): `collectors.scrape.loop.ScrapeLoop` scrapes each target on its
    own schedule (offsets spread over the interval, as Prometheus's are) and hands each page to
    `servewatch.scraping.PageBatcher`, which batches the pages that arrive while a write is
    queued into one `ingest_pages` call on the `StoreWriter` thread. The batch sizes are the
    product's own, not chosen here.
  - rounds (`servewatch scrape`): every target fetched at once with the scrape client (kept
    across rounds), then one `ingest_pages` call for the whole round.
  Wall: the median over batches of the ingest's wall time (parse + catalogue + store) over the
  batch's sample lines, and with the fetches of its pages added (fetch + parse + store, the
  same span as Prometheus's scrape_duration_seconds). CPU: the writer's CPU time (parse +
  store), and the whole process's (fetch + parse + store and everything else it runs).

Target (issue 4): parse + store per sample no more than Prometheus's per-sample scrape cost.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import httpx

from bench.parse_exposition import sample_lines, vllm_page
from bench.report import Comparison
from servewatch.collectors.metrics.ingest import NO_DROP, MetricIngestReport, ingest_pages
from servewatch.collectors.metrics.page import Page
from servewatch.collectors.scrape import event_loop
from servewatch.collectors.scrape.loop import ScrapeLoop, ScrapeOutcome, default_client
from servewatch.collectors.scrape.scraper import scrape_targets
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.store_writer import StoreWriter
from servewatch.config import ScrapeSettings
from servewatch.scraping import PageBatcher, page_of, scheduled_targets
from servewatch.store import Store

LOOPBACK = "127.0.0.1"
REPLICAS = 16
PAGES_PER_ENDPOINT = 4
INTERVAL_S = 1.0
WARMUP_S = 3.0  # first scrapes (new series, cold caches) left out of every figure
PROMETHEUS = "prometheus"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SERVER_CORE, SCRAPER_CORE = 0, 1
# The endpoints speak HTTP/1.1 and keep connections alive; SCRAPE_COST_HTTP=1.0 makes them
# answer HTTP/1.0 and close each connection (the benchmark's endpoints until the scrape client
# kept connections; both scrapers then connect anew for every scrape).
HTTP_VERSION = f"HTTP/{os.environ.get('SCRAPE_COST_HTTP', '1.1')}"


class _PageServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, pages: list[bytes]) -> None:
        super().__init__((LOOPBACK, 0), _PageHandler)
        self.pages = pages
        self.served = 0
        self.lock = threading.Lock()

    def next_page(self) -> bytes:
        with self.lock:
            page = self.pages[self.served % len(self.pages)]
            self.served += 1
        return page


class _PageHandler(BaseHTTPRequestHandler):
    server: _PageServer
    # Keep-alive, as vLLM's server (uvicorn) and exporters answer; its own TCP_NODELAY, so the
    # head and the body, written apart, are not held back by Nagle's algorithm.
    protocol_version = HTTP_VERSION
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = self.server.next_page()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        return


def _serve(count: int, ports: Connection, stop: EventType, cores: set[int]) -> None:
    """Child process: serve the endpoints until `stop` is set. A process of its own, on a core
    of its own, so neither scraper's parsing slows the other's fetches."""
    os.sched_setaffinity(0, cores)
    servers = [
        _PageServer([_page(i * PAGES_PER_ENDPOINT + k) for k in range(PAGES_PER_ENDPOINT)])
        for i in range(count)
    ]
    threads = [
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}) for s in servers
    ]
    for thread in threads:
        thread.start()
    ports.send([int(s.server_address[1]) for s in servers])
    stop.wait()
    for server in servers:
        server.shutdown()
        server.server_close()
    for thread in threads:
        thread.join()


@contextmanager
def endpoints(count: int, cores: set[int]) -> Iterator[list[int]]:
    """`count` endpoints served by a child process on `cores`; yields their ports."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    stop = context.Event()
    child = context.Process(target=_serve, args=(count, send, stop, cores))
    child.start()
    try:
        if not receive.poll(120):
            raise RuntimeError("the endpoint process did not start")
        yield receive.recv()
    finally:
        stop.set()
        child.join(timeout=30)


@dataclass
class Peer:
    url: str
    pid: int

    def cpu_s(self) -> float:
        """The process's user + system CPU time so far, from /proc (clock ticks)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def prometheus(addresses: list[str], work: Path, cores: set[int]) -> Iterator[Peer]:
    """A Prometheus scraping `addresses` every INTERVAL_S; yields it once ready. It runs on
    `cores`, which must be this process's affinity when called (a child inherits it)."""
    config = work / "prometheus.yml"
    targets = ", ".join(f'"{a}"' for a in addresses)
    config.write_text(
        "global:\n"
        f"  scrape_interval: {INTERVAL_S:g}s\n"
        f"  scrape_timeout: {INTERVAL_S:g}s\n"
        "scrape_configs:\n"
        "  - job_name: vllm\n"
        f"    static_configs: [{{targets: [{targets}]}}]\n",
        encoding="utf-8",
    )
    with _bound_socket_port() as port:
        listen = f"{LOOPBACK}:{port}"
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address={listen}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # Go sizes GOMAXPROCS from the affinity; said here all the same.
        env={**os.environ, "GOMAXPROCS": str(len(cores))},
    )
    if os.sched_getaffinity(process.pid) != cores:  # inherited from this process: see run()
        process.terminate()
        raise RuntimeError(f"prometheus is not pinned to cores {sorted(cores)}")
    url = f"http://{listen}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not become ready at {url}")
            time.sleep(0.2)  # an external process: its readiness can only be asked
        yield Peer(url, process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def _bound_socket_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        yield int(sock.getsockname()[1])


@dataclass
class Batch:
    """One `ingest_pages` call of ours: its sample lines, wall and CPU time, and the wall time
    of fetching its pages (service: each page's fetch, added up, as Prometheus counts each
    scrape's; rounds: the round's concurrent fetch)."""

    samples: int
    ingest_s: float
    ingest_cpu_s: float
    fetch_s: float


@dataclass
class Window:
    """One mode of ours: its batches, and the process's and the peer's CPU over the window."""

    mode: str
    batches: list[Batch] = field(default_factory=list)
    process_cpu_s: float = 0.0
    peer_cpu_s: float = 0.0
    started: float = 0.0  # epoch seconds
    ended: float = 0.0
    load_1m: float = 0.0  # the machine's 1-minute load average when the window ended

    @property
    def samples(self) -> int:
        return sum(b.samples for b in self.batches)

    def median_ns(self, cost: Callable[[Batch], float]) -> float:
        return statistics.median(cost(b) / b.samples for b in self.batches) * 1e9

    def cpu_ns(self, cpu_s: float) -> float:
        return cpu_s / self.samples * 1e9


@contextmanager
def _measured(mode: str, peer: Peer) -> Iterator[Window]:
    window = Window(mode)
    peer_cpu, process_cpu = peer.cpu_s(), time.process_time()
    window.started = time.time()
    yield window
    window.ended = time.time()
    window.load_1m = os.getloadavg()[0]
    window.process_cpu_s = time.process_time() - process_cpu
    window.peer_cpu_s = peer.cpu_s() - peer_cpu


class _TimedBatcher(PageBatcher):
    """The service's PageBatcher, its writes timed; what it batches is its own doing."""

    def __init__(self, writer: StoreWriter, record: Callable[[MetricIngestReport], None]) -> None:
        super().__init__(
            writer, keep_uncatalogued=lambda: True, drop=lambda: NO_DROP, on_report=record
        )
        self.started = 0.0
        self.cpu_started = 0.0

    def _write(self, store: Store) -> None:
        self.started, self.cpu_started = time.perf_counter(), time.thread_time()
        super()._write(store)


def service_window(targets: list[Target], store: Store, peer: Peer, *, seconds: float) -> Window:
    """`servewatch run`'s scrape path: ScrapeLoop, PageBatcher, StoreWriter, as the service
    wires them (servewatch/service.py), for WARMUP_S + `seconds`; the window is the latter."""
    handed: deque[tuple[int, float]] = deque()  # (sample lines, fetch wall) per page, in order
    measuring = threading.Event()
    window = Window("service")

    def record(report: MetricIngestReport) -> None:
        wall = time.perf_counter() - batcher.started
        cpu = time.thread_time() - batcher.cpu_started
        pages = [handed.popleft() for _ in range(report.pages)]
        if measuring.is_set():
            window.batches.append(
                Batch(sum(n for n, _ in pages), wall, cpu, sum(f for _, f in pages))
            )

    class Observer:
        def scraped(self, outcome: ScrapeOutcome) -> None:
            result = outcome.result
            lines = _lines(result.body)
            handed.append((lines, result.duration_s))
            batcher.add(page_of(result))

        def skipped(self, target: Target, slots: int) -> None:
            raise RuntimeError(f"{target.url} skipped {slots} slot(s): the scraper fell behind")

    settings = ScrapeSettings(interval_s=INTERVAL_S, timeout_s=INTERVAL_S)
    with StoreWriter(store) as writer:
        batcher = _TimedBatcher(writer, record)
        loop = ScrapeLoop(Observer())
        loop.start()
        try:
            loop.set_targets(scheduled_targets(targets, settings))
            time.sleep(WARMUP_S)  # the loop runs on its own thread; nothing to wait on here
            with _measured("service", peer) as measured:
                measuring.set()
                time.sleep(seconds)
                measuring.clear()
        finally:
            loop.stop()
            writer.flush()
    measured.batches = window.batches
    return measured


def rounds_window(targets: list[Target], store: Store, peer: Peer, *, seconds: float) -> Window:
    """`servewatch scrape`'s path: every target fetched at once, one `ingest_pages` a round."""
    return event_loop.run(_rounds(targets, store, peer, seconds=seconds))


async def _rounds(targets: list[Target], store: Store, peer: Peer, *, seconds: float) -> Window:
    loop = asyncio.get_running_loop()
    async with default_client() as client:  # kept across rounds: its connections are kept
        for warm in (True, False):
            with _measured("rounds", peer) if not warm else _unmeasured() as window:
                ends = loop.time() + (WARMUP_S if warm else seconds)
                next_round = loop.time()
                while next_round < ends:
                    await asyncio.sleep(max(0.0, next_round - loop.time()))
                    fetching = time.perf_counter()
                    results = await scrape_targets(targets, client=client, timeout_s=INTERVAL_S)
                    # The round's fetches run together on this thread: their wall time is the
                    # round's, not the sum of each page's (each of which waits for the others).
                    fetch = time.perf_counter() - fetching
                    pages = [
                        Page(r.target, r.started_ts, r.body, r.duration_s, r.openmetrics, r.error)
                        for r in results
                    ]
                    started, cpu = time.perf_counter(), time.thread_time()
                    ingest_pages(pages, store=store)
                    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
                    lines = sum(_lines(r.body) for r in results)
                    window.batches.append(Batch(lines, wall, cpu, fetch))
                    next_round += INTERVAL_S
    return window


def _lines(body: str | None) -> int:
    """Sample lines of a page: the benchmark's bookkeeping, which runs in our process's CPU
    window, so it is two C-speed counts, not a parse or a hash of the page (a dict keyed by
    the page hashed its 35 KB at every scrape). Exact for the pages the endpoints serve, whose
    lines all end with a newline and which have no empty line: `_count_pages` checks it on
    every one against `sample_lines`."""
    if body is None:
        return 0
    return body.count("\n") - body.count("\n#") - body.startswith("#")


def _count_pages(count: int) -> None:
    for seed in range(count * PAGES_PER_ENDPOINT):
        page = _page(seed).decode()
        if _lines(page) != sample_lines(page)[0]:
            raise RuntimeError(f"page {seed}: the quick line count is not the page's")


def _page(seed: int) -> bytes:
    return vllm_page(seed=seed).encode()


@contextmanager
def _unmeasured() -> Iterator[Window]:
    yield Window("warm-up")


def peer_costs(peer: Peer, window: Window) -> tuple[float, float, int]:
    """Prometheus over `window`: median ns per sample of its scrapes (scrape_duration_seconds
    over scrape_samples_scraped, scrape by scrape), ns of its CPU per sample, samples."""
    span = max(1, round((window.ended - window.started) * 1000))  # ms: the window exactly
    series: dict[str, dict[tuple[str, float], float]] = {}
    for metric in ("scrape_duration_seconds", "scrape_samples_scraped"):
        response = httpx.get(
            f"{peer.url}/api/v1/query",
            params={"query": f'{metric}{{job="vllm"}}[{span}ms]', "time": f"{window.ended:.3f}"},
            timeout=10,
        )
        response.raise_for_status()
        result = response.json()["data"]["result"]
        series[metric] = {
            (r["metric"]["instance"], float(t)): float(v) for r in result for t, v in r["values"]
        }
    durations, counts = series["scrape_duration_seconds"], series["scrape_samples_scraped"]
    ratios = [d / counts[k] for k, d in durations.items() if counts.get(k)]
    if not ratios:
        raise RuntimeError("prometheus has no scrapes of the endpoints in the window")
    samples = int(sum(counts.values()))
    return statistics.median(ratios) * 1e9, window.peer_cpu_s / samples * 1e9, samples


def run(*, quick: bool = False) -> list[Comparison]:
    if shutil.which(PROMETHEUS) is None:
        raise RuntimeError(f"{PROMETHEUS} is not on PATH; the peer of this benchmark needs it")
    if len(os.sched_getaffinity(0)) < 2:
        raise RuntimeError("this benchmark pins the endpoints and the scrapers to 2 cores")
    seconds = 10.0 if quick else 30.0
    affinity = os.sched_getaffinity(0)
    _count_pages(REPLICAS)
    with (
        tempfile.TemporaryDirectory(prefix="servewatch-scrape-cost-") as tmp,
        endpoints(REPLICAS, {SERVER_CORE}) as ports,
    ):
        work = Path(tmp)
        addresses = [f"{LOOPBACK}:{port}" for port in ports]
        targets = [
            Target(
                target_id=f"vllm-{i}",
                kind=TargetKind.VLLM,
                url=f"http://{a}/metrics",
                replica=f"vllm-{i}",
            )
            for i, a in enumerate(addresses)
        ]
        os.sched_setaffinity(0, {SCRAPER_CORE})
        try:
            with prometheus(addresses, work, {SCRAPER_CORE}) as peer:
                windows = []
                for mode, measure in (("service", service_window), ("rounds", rounds_window)):
                    with Store.open(work / f"{mode}.duckdb") as store:
                        windows.append(measure(targets, store, peer, seconds=seconds))
                costs = [peer_costs(peer, w) for w in windows]
        finally:
            os.sched_setaffinity(0, affinity)
    return [
        c
        for w, peer_cost in zip(windows, costs, strict=True)
        for c in _comparisons(w, *peer_cost, seconds=seconds)
    ]


def _comparisons(
    window: Window, peer_wall_ns: float, peer_cpu_ns: float, peer_samples: int, *, seconds: float
) -> list[Comparison]:
    batches = [b.samples for b in window.batches]
    what = (
        f"{REPLICAS} vLLM endpoints every {INTERVAL_S:g} s, {seconds:g} s, {window.mode}: "
        f"{len(batches)} batches of median {statistics.median(batches):,.0f} samples, "
        f"endpoints {HTTP_VERSION}, both scrapers on one core, machine load {window.load_1m:.1f}"
    )
    ours = f"servewatch ({window.samples:,} samples)"
    peer = f"Prometheus ({peer_samples:,} samples)"
    return [
        Comparison(
            benchmark=f"{what}; wall, median per batch / scrape: parse + store (target >= 1)",
            unit="ns/sample",
            ours_label=f"{ours} ingest_pages",
            ours=window.median_ns(lambda b: b.ingest_s),
            peer_label=f"{peer} scrape_duration_seconds (fetch + parse + append)",
            peer=peer_wall_ns,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=f"{what}; wall, median per batch / scrape: fetch + parse + store",
            unit="ns/sample",
            ours_label=f"{ours} page fetches + ingest_pages",
            ours=window.median_ns(lambda b: b.ingest_s + b.fetch_s),
            peer_label=f"{peer} scrape_duration_seconds",
            peer=peer_wall_ns,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=f"{what}; CPU over the window: parse + store (ours) / whole process (peer)",
            unit="ns/sample",
            ours_label=f"{ours} CPU of the ingest calls",
            ours=window.cpu_ns(sum(b.ingest_cpu_s for b in window.batches)),
            peer_label=f"{peer} process CPU",
            peer=peer_cpu_ns,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=f"{what}; CPU over the window: whole process",
            unit="ns/sample",
            ours_label=f"{ours} process CPU",
            ours=window.cpu_ns(window.process_cpu_s),
            peer_label=f"{peer} process CPU",
            peer=peer_cpu_ns,
            higher_is_better=False,
        ),
    ]
