"""Exposition parse throughput: servewatch's parser against prometheus_client's text parser.

Input: vLLM V1 `/metrics` pages (text format 0.0.4) built with prometheus_client from vLLM's
metric names and default buckets (../shared/REFERENCE.md section 1): one engine, ~270 samples,
`_created` samples included as a single-process server writes them.

- one page: `parse_exposition` with a fresh cache, so every series key and label set of the
  page is parsed (target: at least 6x the peer);
- a batch of 8 replica pages of one model: `parse_expositions`, which shares one cache across
  the batch (replicas of a pool expose the same series) and returns one Polars frame
  (target: at least 15x);
- the same batch with a different model on every page, so nothing is shared across pages:
  what the batch costs when replicas share no series.

Peer: `prometheus_client.parser.text_string_to_metric_families` on the same text, every sample
materialised; labels are fully parsed on both sides (the peer into dicts, ours into canonical
JSON). Throughput counts the sample lines of the input for both sides (ours leaves out the
`_created` ones, after reading them). Both sides run in alternating rounds and the best round of
each is kept, so load from other processes disturbs both alike.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.report import Comparison
from servewatch.collectors.metrics.exposition import parse_exposition
from servewatch.collectors.metrics.exposition_batch import parse_expositions

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560,
)  # fmt: skip
TPOT_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1, 2.5, 5, 7.5, 10, 20, 40, 80,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60,
    120, 240, 480, 960, 1920, 7680,
)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

HISTOGRAMS: tuple[tuple[str, tuple[float, ...]], ...] = (
    ("time_to_first_token_seconds", TTFT_BUCKETS),
    ("inter_token_latency_seconds", TPOT_BUCKETS),
    ("request_time_per_output_token_seconds", TPOT_BUCKETS),
    ("e2e_request_latency_seconds", LATENCY_BUCKETS),
    ("request_queue_time_seconds", LATENCY_BUCKETS),
    ("request_prefill_time_seconds", LATENCY_BUCKETS),
    ("request_decode_time_seconds", LATENCY_BUCKETS),
    ("request_inference_time_seconds", LATENCY_BUCKETS),
    ("request_prompt_tokens", TOKEN_BUCKETS),
    ("request_generation_tokens", TOKEN_BUCKETS),
    ("iteration_tokens_total", ITERATION_BUCKETS),
)
COUNTERS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prompt_tokens",
    "generation_tokens",
    "num_preemptions",
)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_page(*, seed: int, model: str = MODEL) -> str:
    """One replica's `/metrics` page after serving some requests; values vary with `seed`."""
    rng = random.Random(seed)
    registry = CollectorRegistry()
    names = ["model_name", "engine"]
    labels = (model, "0")
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        Gauge(f"vllm:{gauge}", gauge, names, registry=registry).labels(*labels).set(rng.random())
    for counter in COUNTERS:
        total = Counter(f"vllm:{counter}", counter, names, registry=registry)
        total.labels(*labels).inc(rng.randrange(1, 10**7))
    success = Counter(
        "vllm:request_success", "finished", [*names, "finished_reason"], registry=registry
    )
    for reason in FINISHED_REASONS:
        success.labels(*labels, reason).inc(rng.randrange(0, 10**4))
    for histogram, buckets in HISTOGRAMS:
        observed = Histogram(
            f"vllm:{histogram}", histogram, names, buckets=buckets, registry=registry
        )
        for _ in range(40):
            observed.labels(*labels).observe(rng.expovariate(1 / buckets[len(buckets) // 2]))
    return generate_latest(registry).decode()


def sample_lines(text: str) -> tuple[int, int]:
    """Sample lines of a page and how many of them are `_created` samples."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return len(lines), sum(1 for line in lines if line.split("{")[0].endswith("_created"))


def peer_parse(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def best_seconds(
    ours: Callable[[], object], peer: Callable[[], object], *, rounds: int
) -> tuple[float, float]:
    """Best time of one call of each, over alternating rounds of a few calls each."""
    ours_calls = _calls_for(ours)
    peer_calls = _calls_for(peer)
    best_ours = best_peer = float("inf")
    for _ in range(rounds):
        best_ours = min(best_ours, _timed(ours, ours_calls))
        best_peer = min(best_peer, _timed(peer, peer_calls))
    return best_ours, best_peer


def _calls_for(fn: Callable[[], object]) -> int:
    """Enough calls to fill about 50 ms, so timer resolution does not matter."""
    once = _timed(fn, 1)
    return max(1, int(0.05 / max(once, 1e-6)))


def _timed(fn: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def run(*, quick: bool = False) -> list[Comparison]:
    rounds = 3 if quick else 9
    single = vllm_page(seed=0)
    pool = [vllm_page(seed=i) for i in range(8)]
    mixed = [vllm_page(seed=i, model=f"org/model-{i}") for i in range(8)]
    return [
        measure_single(single, rounds=rounds),
        measure_batch(pool, rounds=rounds, what="8 replica pages of one model (target >= 15x)"),
        measure_batch(mixed, rounds=rounds, what="8 replica pages of 8 models (nothing shared)"),
    ]


def measure_single(text: str, *, rounds: int) -> Comparison:
    lines, created = sample_lines(text)
    if len(parse_exposition(text)) != lines - created or peer_parse(text) != lines:
        raise RuntimeError("the parsers disagree on the sample count of the benchmark page")
    ours_s, peer_s = best_seconds(
        lambda: parse_exposition(text), lambda: peer_parse(text), rounds=rounds
    )
    return Comparison(
        benchmark=f"parse one vLLM V1 page, {lines} samples, labels parsed (target >= 6x)",
        unit="samples/s",
        ours_label="servewatch parse_exposition",
        ours=lines / ours_s,
        peer_label="prometheus_client text_string_to_metric_families",
        peer=lines / peer_s,
    )


def measure_batch(pages: list[str], *, rounds: int, what: str) -> Comparison:
    counts = [sample_lines(text) for text in pages]
    lines = sum(n for n, _ in counts)
    expected = sum(n - created for n, created in counts)
    if parse_expositions(pages).samples.height != expected:
        raise RuntimeError("parse_expositions lost samples of the benchmark batch")
    ours_s, peer_s = best_seconds(
        lambda: parse_expositions(pages),
        lambda: [peer_parse(text) for text in pages],
        rounds=rounds,
    )
    return Comparison(
        benchmark=f"parse a batch of {what}, {lines} samples",
        unit="samples/s",
        ours_label="servewatch parse_expositions (one frame)",
        ours=lines / ours_s,
        peer_label="prometheus_client text_string_to_metric_families",
        peer=lines / peer_s,
    )
