"""Scrape lag: `servewatch run`'s per-target scheduler against Prometheus on 300 targets.

Targets: 300 HTTP endpoints on 127.0.0.1 (one port each, keep-alive), served by a separate
process so the target side takes no CPU time of the scraper's interpreter. Each serves its own
vLLM V1 page (bench/parse_exposition.py: ~270 samples, ~35 KB).

- servewatch: the real `Service` (scrape loop, scraper, page batches through the single store
  writer thread into DuckDB, the APScheduler jobs, the OTLP receiver) reading the targets from a
  file_sd file. Lag is exact: each stored scrape's start minus its slot, which follows from the
  target's identity (collectors/scrape/schedule.py). Overlaps come from the stored scrapes
  (a start before the previous scrape's start plus its duration); skipped slots from the
  service's own counter.
- peer: Prometheus 2.42, started with the same file_sd file and interval, scraping the same
  targets at the same time, so both share the machine's load.

Two measures are compared, each taken from the tool's own data:

- interval jitter: how far the time between consecutive scrapes of a target strays from the
  interval. Ours: p99 of |gap - interval| over all stored scrapes. Prometheus: from its own
  `prometheus_target_interval_length_seconds` summary, the larger of q0.99 - interval and
  interval - q0.01 (real start times; this summary is how Prometheus reports its own lag).
- phase lag from stored timestamps: per target, each scrape's time modulo the interval minus
  the target's earliest phase, p99. Prometheus stores millisecond timestamps and pulls a
  timestamp within 2 ms of the expected one onto it, so its figure is floored at 1 ms.

Both runs warm up for one interval (connection set-up, Prometheus's target discovery) before
the measured window starts.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from bench.parse_exposition import vllm_page
from bench.report import Comparison
from servewatch.collectors.scrape.schedule import TargetSchedule, offset_s
from servewatch.service import Service
from servewatch.store import Store

TARGETS = 300
LAG_LIMIT_S = 2.0


@dataclass(frozen=True)
class Settings:
    targets: int
    interval_s: float
    intervals: int  # measured, after one interval of warm-up

    @property
    def timeout_s(self) -> float:
        return min(10.0, self.interval_s)


@dataclass(frozen=True)
class OurRun:
    lags_s: list[float]
    jitter_s: list[float]
    phase_lags_s: list[float]
    scrapes: int
    failed: int
    skipped_slots: int
    overlaps: int
    errors: dict[str, int]


@dataclass(frozen=True)
class PeerRun:
    scrapes: int
    jitter_s: float
    phase_lags_s: list[float]
    interval_quantiles_s: dict[str, float]


# -- the targets ----------------------------------------------------------------------------


def _serve_targets(count: int, conn: Connection) -> None:
    """In a child process: `count` vLLM pages on their own ports until terminated."""
    pages = [vllm_page(seed=i, model=f"org/model-{i % 4}").encode() for i in range(count)]
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sockets.append(sock)
    conn.send([s.getsockname()[1] for s in sockets])

    async def main() -> None:
        def handler(
            body: bytes,
        ) -> object:
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()

            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                try:
                    while True:
                        await reader.readuntil(b"\r\n\r\n")
                        writer.write(head + body)
                        await writer.drain()
                except (asyncio.IncompleteReadError, ConnectionError):
                    pass
                finally:
                    writer.close()

            return handle

        servers = [
            await asyncio.start_server(handler(page), sock=sock)  # type: ignore[arg-type]
            for page, sock in zip(pages, sockets, strict=True)
        ]
        await asyncio.gather(*(s.serve_forever() for s in servers))

    asyncio.run(main())


# -- servewatch -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _epoch_s(ts: datetime) -> float:
    return ts.replace(tzinfo=UTC).timestamp()


def _phase_lags(times_by_target: dict[str, list[float]], interval_s: float) -> list[float]:
    """Each scrape's phase within the interval against its target's earliest phase."""
    out: list[float] = []
    for times in times_by_target.values():
        if not times:
            continue
        first = times[0]
        residuals = [((t - first + interval_s / 2) % interval_s) - interval_s / 2 for t in times]
        least = min(residuals)
        out.extend(r - least for r in residuals)
    return out


def _run_ours(folder: Path, sd_file: Path, settings: Settings, window: threading.Event) -> OurRun:
    config = folder / "servewatch.toml"
    db = folder / "servewatch.duckdb"
    config.write_text(
        f'[store]\npath = "{db}"\n[scrape]\ninterval_s = {settings.interval_s}\n'
        f'timeout_s = {settings.timeout_s}\n[[file_sd]]\npath = "{sd_file}"\n'
        '[otlp]\nlisten = "127.0.0.1:0"\n',
        encoding="utf-8",
    )
    service = Service(config)
    service.start(health_port=0)
    try:
        time.sleep(settings.interval_s)  # warm-up: first connections, first slots
        measured_from = time.time()
        skipped_before = service.metrics.skipped_slots._value.get()
        window.wait()
        measured_to = time.time()
        skipped = int(service.metrics.skipped_slots._value.get() - skipped_before)
    finally:
        service.stop()
    with Store.open(db) as store:
        scrapes = store.read_scrapes().collect()
    scrapes = scrapes.with_columns((pl.col("ts").dt.epoch("us") / 1e6).alias("start_s")).filter(
        pl.col("start_s").is_between(measured_from, measured_to)
    )
    lags: list[float] = []
    jitter: list[float] = []
    overlaps = 0
    times: dict[str, list[float]] = {}
    for (target_id,), group in scrapes.sort("start_s").group_by("target_id", maintain_order=True):
        schedule = TargetSchedule(
            interval_s=settings.interval_s,
            timeout_s=settings.timeout_s,
            offset_s=offset_s(str(target_id), interval_s=settings.interval_s),
        )
        starts = group["start_s"].to_list()
        durations = group["duration_s"].fill_null(0.0).to_list()
        times[str(target_id)] = starts
        lags.extend(t - schedule.slot_at_or_before(t) for t in starts)
        for i in range(1, len(starts)):
            jitter.append(abs(starts[i] - starts[i - 1] - settings.interval_s))
            if starts[i] < starts[i - 1] + durations[i - 1]:
                overlaps += 1
    return OurRun(
        lags_s=lags,
        jitter_s=jitter,
        phase_lags_s=_phase_lags(times, settings.interval_s),
        scrapes=scrapes.height,
        failed=scrapes.filter(~pl.col("ok")).height,
        skipped_slots=skipped,
        overlaps=overlaps,
        errors=dict(
            scrapes.filter(~pl.col("ok"))
            .group_by("error")
            .len()
            .sort("len", descending=True)
            .head(3)
            .iter_rows()
        ),
    )


# -- Prometheus -----------------------------------------------------------------------------


def _duration_text(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds == int(seconds) else f"{int(seconds * 1000)}ms"


def _start_prometheus(
    folder: Path, sd_file: Path, settings: Settings
) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (Debian package prometheus): no peer")
    config = {
        "global": {
            "scrape_interval": _duration_text(settings.interval_s),
            "scrape_timeout": _duration_text(settings.timeout_s),
        },
        "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [{"files": [str(sd_file)]}]}],
    }
    config_path = folder / "prometheus.yml"
    config_path.write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    port = _free_port()
    log = (folder / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={folder / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited; see {folder / 'prometheus.log'}")
        try:
            if client.get("/-/ready").status_code == 200:
                return process, client
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("prometheus did not become ready within 60 s")


def _query(client: httpx.Client, promql: str, at_s: float) -> list[dict[str, object]]:
    answer = client.get("/api/v1/query", params={"query": promql, "time": at_s}).json()
    if answer.get("status") != "success":
        raise RuntimeError(f"prometheus query {promql!r} failed: {answer}")
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


def _measure_prometheus(
    client: httpx.Client, settings: Settings, measured_from: float, measured_to: float
) -> PeerRun:
    span = math.floor(measured_to - measured_from)
    times: dict[str, list[float]] = {}
    for series in _query(client, f'up{{job="vllm"}}[{span}s]', measured_to):
        metric = series["metric"]
        values = series["values"]
        assert isinstance(metric, dict)
        assert isinstance(values, list)
        times[str(metric["instance"])] = [float(ts) for ts, _ in values]
    # Prometheus's own metrics are not in its TSDB unless it scrapes itself: read its page.
    label = _duration_text(settings.interval_s)
    quantiles = {
        sample.labels["quantile"]: sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        if family.name == "prometheus_target_interval_length_seconds"
        for sample in family.samples
        if sample.labels.get("interval") == label and "quantile" in sample.labels
    }
    if "0.99" not in quantiles or "0.01" not in quantiles:
        raise RuntimeError(f"prometheus reported no interval quantiles for {label}: {quantiles}")
    jitter = max(quantiles["0.99"] - settings.interval_s, settings.interval_s - quantiles["0.01"])
    return PeerRun(
        scrapes=sum(len(t) for t in times.values()),
        jitter_s=max(jitter, 0.0),
        phase_lags_s=_phase_lags(times, settings.interval_s),
        interval_quantiles_s=quantiles,
    )


# -- the run --------------------------------------------------------------------------------


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def measure(settings: Settings) -> tuple[OurRun, PeerRun]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve_targets, args=(settings.targets, child), daemon=True)
    server.start()
    with tempfile.TemporaryDirectory(prefix="servewatch-scrape-lag-") as tmp:
        folder = Path(tmp)
        try:
            ports = parent.recv()
            sd_file = folder / "targets.json"
            groups = [
                {
                    "targets": [f"127.0.0.1:{port}"],
                    "labels": {"kind": "vllm", "replica": f"vllm-{i}"},
                }
                for i, port in enumerate(ports)
            ]
            sd_file.write_text(json.dumps(groups), encoding="utf-8")
            process, client = _start_prometheus(folder, sd_file, settings)
            try:
                window = threading.Event()
                ours: list[OurRun] = []
                runner = threading.Thread(
                    target=lambda: ours.append(_run_ours(folder, sd_file, settings, window))
                )
                runner.start()
                time.sleep(settings.interval_s)  # the same warm-up as ours
                measured_from = time.time()
                time.sleep(settings.interval_s * settings.intervals)
                measured_to = time.time()
                window.set()
                runner.join()
                if not ours:
                    raise RuntimeError("the servewatch run failed; see the log above")
                peer = _measure_prometheus(client, settings, measured_from, measured_to)
            finally:
                client.close()
                process.terminate()
                process.wait(timeout=30)
        finally:
            server.terminate()
            server.join()
    return ours[0], peer


def run(*, quick: bool = False) -> list[Comparison]:
    settings = (
        # The full run's scrape rate (20 a second), in less time.
        Settings(targets=TARGETS // 3, interval_s=5.0, intervals=4)
        if quick
        else Settings(targets=TARGETS, interval_s=15.0, intervals=8)
    )
    load_before = os.getloadavg()[0]
    ours, peer = measure(settings)
    load_after = os.getloadavg()[0]
    expected = settings.targets * settings.intervals
    lag_p50, lag_p99, lag_max = (
        _quantile(ours.lags_s, 0.5),
        _quantile(ours.lags_s, 0.99),
        max(ours.lags_s, default=math.nan),
    )
    ok = lag_max < LAG_LIMIT_S and ours.overlaps == 0 and ours.skipped_slots == 0
    print(
        f"== scrape_lag: {settings.targets} targets every {settings.interval_s:g} s, "
        f"{settings.intervals} intervals measured after 1 of warm-up; "
        f"load average {load_before:.1f} before, {load_after:.1f} after ({os.cpu_count()} cores)\n"
        f"  servewatch: {ours.scrapes} scrapes (about {expected} expected), {ours.failed} failed; "
        f"lag p50 {lag_p50 * 1000:.1f} ms, p99 {lag_p99 * 1000:.1f} ms, "
        f"max {lag_max * 1000:.1f} ms; {ours.skipped_slots} skipped slots, "
        f"{ours.overlaps} overlaps{'; errors ' + str(ours.errors) if ours.errors else ''}\n"
        f"  target: lag under {LAG_LIMIT_S:g} s, no overlap, no skipped slot: "
        f"{'met' if ok else 'MISSED'}\n"
        f"  prometheus: {peer.scrapes} scrapes; interval quantiles "
        + ", ".join(f"q{q} {v:.4f} s" for q, v in sorted(peer.interval_quantiles_s.items())),
        flush=True,
    )
    return [
        Comparison(
            benchmark=(
                f"scrape interval jitter p99, {settings.targets} targets at "
                f"{settings.interval_s:g} s (lower is better)"
            ),
            unit="us",
            ours_label="servewatch run: p99 |gap - interval|",
            ours=max(_quantile(ours.jitter_s, 0.99), 1e-6) * 1e6,
            peer_label="prometheus: interval_length q0.99/q0.01 off the interval",
            peer=max(peer.jitter_s, 1e-6) * 1e6,
            higher_is_better=False,
        ),
        Comparison(
            benchmark=(
                "scrape phase lag p99 from stored timestamps (prometheus floored at its 1 ms "
                "resolution)"
            ),
            unit="us",
            ours_label="servewatch run (store, us timestamps)",
            ours=max(_quantile(ours.phase_lags_s, 0.99), 1e-6) * 1e6,
            peer_label="prometheus (TSDB, ms timestamps)",
            peer=max(_quantile(peer.phase_lags_s, 0.99), 0.001) * 1e6,
            higher_is_better=False,
        ),
    ]
