"""How far a Prometheus import at step instants strays from PromQL, against a raw import.

`python -m bench.import_resolution [--scrape-interval 15s] [--window 5m] [--instants 24]`

A real Prometheus 2.42 scrapes a live emulated fleet (four vLLM replicas, two DCGM hosts, on
127.0.0.1) at the scrape interval for four scrapes of warm-up, one window and two minutes of
evaluation instants. The recording is then imported twice, at step instants (`--resolution
step`, step = the scrape interval) and raw (the default). At each evaluation instant t
(spread over the last two minutes, on and between scrape instants) servewatch's
`sli --source histograms` figures per replica over [t - window, t] are held against
Prometheus's own answer to:

- rates: `sum by (replica) (increase(vllm:generation_tokens_total[w]))` and the same of
  `vllm:request_success_total` and `vllm:prompt_tokens_total` (a rate is the increase over w);
- TTFT p95 and p99: `histogram_quantile(q, sum by (replica, le)
  (increase(vllm:time_to_first_token_seconds_bucket[w])))`;
- gauge means: `avg by (replica) (avg_over_time(vllm:kv_cache_usage_perc[w]))` and
  `sum by (replica) (avg_over_time(vllm:num_requests_running[w]))`.

It prints the largest relative error of each family for both imports, and the step import's
median; docs/prometheus-import.md
quotes the figures. The run takes the window plus about three minutes of wall-clock time.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from servewatch.collectors.prometheus.api import PrometheusApi
from servewatch.collectors.prometheus.reader import (
    ImportWindow,
    Resolution,
    from_ms,
    import_range,
    plan_import,
)
from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.live_server import LiveFleetServer
from servewatch.pipeline.instants import parse_duration
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

EVALUATION_S = 120.0

# (family, PromQL at instant t over range w, the servewatch figure of one replica's block)
Figure = tuple[str, str, Callable[[dict[str, Any]], float | None]]
FIGURES: tuple[Figure, ...] = (
    (
        "rates",
        "sum by (replica) (increase(vllm:generation_tokens_total[{w}]))",
        lambda b: b["generation_tokens"],
    ),
    (
        "rates",
        "sum by (replica) (increase(vllm:request_success_total[{w}]))",
        lambda b: sum(b["finish_reasons"].values()) if b["finish_reasons"] else None,
    ),
    (
        "rates",
        "sum by (replica) (increase(vllm:prompt_tokens_total[{w}]))",
        lambda b: b["prompt_tokens"],
    ),
    (
        "TTFT p95",
        (
            "histogram_quantile(0.95, sum by (replica, le) "
            "(increase(vllm:time_to_first_token_seconds_bucket[{w}])))"
        ),
        lambda b: b["ttft_s"]["p95"],
    ),
    (
        "TTFT p99",
        (
            "histogram_quantile(0.99, sum by (replica, le) "
            "(increase(vllm:time_to_first_token_seconds_bucket[{w}])))"
        ),
        lambda b: b["ttft_s"]["p99"],
    ),
    (
        "gauge means",
        "avg by (replica) (avg_over_time(vllm:kv_cache_usage_perc[{w}]))",
        lambda b: b["kv_cache_usage_ratio"]["mean"],
    ),
    (
        "gauge means",
        "sum by (replica) (avg_over_time(vllm:num_requests_running[{w}]))",
        lambda b: b["requests_running"]["mean"],
    ),
)


@contextmanager
def recording(
    workdir: Path, *, scrape_interval_s: float, run_s: float
) -> Iterator[tuple[httpx.Client, int, int]]:
    """(client of the Prometheus, first and last whole second of the recording in ms)."""
    config = FleetConfig()
    ports = fleet_ports(config)
    unstarted = LiveFleetServer(config.placements(), started_s=0.0, ports=ports)
    with running_prometheus(
        workdir, scrape_configs(unstarted), scrape_interval_s=scrape_interval_s
    ) as client:
        poll(
            "Prometheus to scrape every target",
            lambda: True if len(instant_query(client, "up")) == len(ports) else None,
            deadline_s=max(45.0, 4 * scrape_interval_s),
        )
        started_s = time.time()
        with live_fleet(config, seed=11, ports=ports):
            time.sleep(run_s)
            end_s = math.floor(time.time())
        # Every target scraped past the end before the answers are read.
        time.sleep(scrape_interval_s + 1)
        yield client, math.ceil(started_s) * 1000, end_s * 1000


def imported(
    url: str, *, resolution: Resolution, start_ms: int, end_ms: int, step_s: float
) -> Store:
    store = Store.open(":memory:")
    window = ImportWindow(
        start=from_ms(start_ms - 60_000),
        end=from_ms(end_ms + round(step_s * 1000)),
        step_s=step_s,
        resolution=resolution,
    )
    with httpx.Client() as client:
        api = PrometheusApi(client, url)
        report = import_range(api, store=store, plan=plan_import(api, window=window))
    if report.problems:
        raise RuntimeError(f"import problems: {report.problems}")
    return store


def relative_error(got: float | None, want: float) -> float:
    if got is None or math.isnan(got):
        return math.inf
    if want == 0:
        return 0.0 if got == 0 else math.inf
    return abs(got - want) / abs(want)


def measure(
    client: httpx.Client,
    stores: dict[str, Store],
    *,
    window_s: float,
    instants_s: list[float],
) -> dict[str, dict[str, list[float]]]:
    """Relative errors per (import, family), one per instant and replica Prometheus answered."""
    errors: dict[str, dict[str, list[float]]] = {name: {} for name in stores}
    for at_s in instants_s:
        at = from_ms(round(at_s * 1000))
        blocks = {
            name: {
                g["replica"]: g
                for g in (
                    histogram_section(
                        store.read_window(from_ts=at - timedelta(seconds=window_s), to_ts=at),
                        by=Grouping.REPLICA,
                    )
                    or {"groups": []}
                )["groups"]
            }
            for name, store in stores.items()
        }
        for family, expr, pick in FIGURES:
            answer = instant_query(client, expr.format(w=f"{round(window_s)}s"), time_s=at_s)
            for item in answer:
                want = float(item["value"][1])
                if math.isnan(want):
                    continue
                replica = item["metric"].get("replica")
                for name in stores:
                    block = blocks[name].get(replica)
                    error = math.inf if block is None else relative_error(pick(block), want)
                    errors[name].setdefault(family, []).append(error)
    return errors


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.import_resolution", description=__doc__)
    parser.add_argument("--scrape-interval", default="15s")
    parser.add_argument("--window", default="5m")
    parser.add_argument("--instants", type=int, default=24)
    args = parser.parse_args()
    interval_s = parse_duration(args.scrape_interval).total_seconds()
    window_s = parse_duration(args.window).total_seconds()
    evaluation_s = min(EVALUATION_S, 32 * interval_s)
    # The fleet warms up for a few scrapes first: no window starts at its first request.
    warmup_s = 4 * interval_s
    with (
        tempfile.TemporaryDirectory() as tmp,
        recording(
            Path(tmp), scrape_interval_s=interval_s, run_s=warmup_s + window_s + evaluation_s
        ) as (
            client,
            start_ms,
            end_ms,
        ),
    ):
        url = str(client.base_url).rstrip("/")
        stores = {
            resolution.value: imported(
                url, resolution=resolution, start_ms=start_ms, end_ms=end_ms, step_s=interval_s
            )
            for resolution in (Resolution.RAW, Resolution.STEP)
        }
        last_s = end_ms / 1000 - 1
        first_s = last_s - evaluation_s
        # Whole seconds a little off the scrape grid, so instants fall on and between scrapes.
        instants_s = [
            float(math.floor(first_s + k * evaluation_s / args.instants) + k % 3)
            for k in range(args.instants)
        ]
        errors = measure(client, stores, window_s=window_s, instants_s=instants_s)
        for store in stores.values():
            store.close()
    compared = sum(len(v) for v in errors["raw"].values())
    print(
        f"scrape interval {args.scrape_interval}, window {args.window}, "
        f"{len(instants_s)} instants, {compared} answers compared; relative error, "
        "largest and median"
    )
    for family, raw in errors["raw"].items():
        step = errors["step"][family]
        print(
            f"  {family:<12} raw max {max(raw):.1e}   "
            f"step max {max(step):.2%} median {median(step):.2%}"
        )


if __name__ == "__main__":
    main()
