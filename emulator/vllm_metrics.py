"""vLLM V1 `/metrics` of emulated replicas: counters, histograms and gauges, as exposition pages.

Names, labels, help texts and default buckets follow vLLM's V1 engine (the `vllm:` prefix,
labels `model_name` and `engine`, single-process `_created` samples). The values are kept as
plain bucket counts and yielded as metric families by a custom prometheus-client collector,
rather than held in client `Histogram` objects, so one engine-step record can add thousands of
inter-token observations at once; prometheus-client still does the encoding, so the bytes are
what a vLLM server would send. Fixture mode renders the same bytes from a template cut from
that encoding (`PageTemplate`), because it writes pages by the thousand.

Every page also carries the gauge `servewatch_emulated 1`, so it can never be taken for a page
of a real fleet.

Size: over 500 lines on purpose: it mirrors vLLM's metric families (names, labels, help texts,
buckets) as one table beside the code that fills them.
"""

from __future__ import annotations

import functools
import math
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from servewatch.emulator.records import (
    EngineSteps,
    FinishedReason,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
    ReplicaState,
)

PAGE_CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
EMULATED_GAUGE = "servewatch_emulated"

# vLLM's default buckets (since April 2025), REFERENCE section 1.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip

ENGINE_LABELS = ("model_name", "engine")
_REASONS = tuple(FinishedReason)  # `vllm:request_success` samples, in this order
# prometheus-client's float formatting (Go's), as its encoder writes values and `le` bounds.
_go_float = cast(Callable[[float], str], floatToGoString)
_GO_PLAIN_BELOW = 1_000_000  # Go writes whole numbers with up to six digits as "123456.0"


def token_count_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to `max_model_len`, the buckets of its token-length histograms."""
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be at least 1, got {max_model_len}")
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_model_len:
                return tuple(buckets)
            buckets.append(float(value))
        scale *= 10


class EngineShape(Protocol):
    """The engine model's parameters the metrics describe (emulator/engine.py EngineParams)."""

    @property
    def max_model_len(self) -> int: ...

    @property
    def block_size_tokens(self) -> int: ...

    @property
    def num_gpu_blocks(self) -> int: ...

    @property
    def enable_prefix_caching(self) -> bool: ...


@dataclass(frozen=True)
class EngineSettings:
    """What a vLLM server reports about its own configuration (the `cache_config_info` labels
    and the token-histogram range). The model name comes from each replica's placement."""

    max_model_len: int = 32768
    block_size: int = 16
    num_gpu_blocks: int = 27_000  # ~432k tokens of KV: an 8B model at 0.9 of an H100 80GB
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    engine: str = "0"

    def __post_init__(self) -> None:
        if self.max_model_len < 1 or self.block_size < 1 or self.num_gpu_blocks < 1:
            raise ValueError(
                "EngineSettings: max_model_len, block_size and num_gpu_blocks must be positive, "
                f"got {self.max_model_len}, {self.block_size}, {self.num_gpu_blocks}"
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                "EngineSettings.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )

    @classmethod
    def from_engine(
        cls, engine: EngineShape, *, gpu_memory_utilization: float = 0.9
    ) -> EngineSettings:
        """The settings a server running the simulated `engine` reports."""
        return cls(
            max_model_len=engine.max_model_len,
            block_size=engine.block_size_tokens,
            num_gpu_blocks=engine.num_gpu_blocks,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=engine.enable_prefix_caching,
        )

    def cache_config_labels(self) -> dict[str, str]:
        # vLLM exports every CacheConfig field as a string label; these are the ones that
        # describe this emulated engine (Python reprs, as vLLM writes them).
        return {
            "block_size": str(self.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": str(self.enable_prefix_caching),
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(self.num_gpu_blocks),
            "prefix_caching_hash_algo": "sha256",
            "swap_space": "4",
        }


class BucketCounts:
    """One classic histogram's state: per-bucket counts (the last one is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        """Add `times` observations of `value` (`le` is inclusive, as in Prometheus)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((_go_float(bound), float(running)))
        return out


class ReplicaMetrics:
    """The metric state of one vLLM process; a restart means a new instance (counters from 0).

    `created_s` is when the process registered its metrics: every `_created` sample holds it.
    """

    def __init__(self, *, model_name: str, created_s: float, settings: EngineSettings) -> None:
        self.model_name = model_name
        self.created_s = created_s
        self.settings = settings
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.success = [0] * len(_REASONS)  # per finished reason, in `_REASONS` order
        length_buckets = token_count_buckets(settings.max_model_len)
        self.iteration_tokens = BucketCounts(ITERATION_TOKENS_BUCKETS)
        self.ttft = BucketCounts(TTFT_BUCKETS_S)
        self.itl = BucketCounts(TOKEN_LATENCY_BUCKETS_S)
        self.tpot = BucketCounts(TOKEN_LATENCY_BUCKETS_S)
        self.e2e = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.queue = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.inference = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.prefill = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.decode = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.prompt_tokens_hist = BucketCounts(length_buckets)
        self.generation_tokens_hist = BucketCounts(length_buckets)
        self.kv_computed_tokens = BucketCounts(length_buckets)
        self.max_tokens = BucketCounts(length_buckets)
        # (name, help, state) in vLLM's registration order.
        self.histograms: tuple[tuple[str, str, BucketCounts], ...] = (
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                self.iteration_tokens,
            ),
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                self.itl,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                self.tpot,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                self.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                self.queue,
            ),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                self.inference,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                self.prefill,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                self.decode,
            ),
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                self.prompt_tokens_hist,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                self.generation_tokens_hist,
            ),
            (
                "vllm:request_prefill_kv_computed_tokens",
                "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                self.kv_computed_tokens,
            ),
            (
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                self.max_tokens,
            ),
        )

    def observe_request(self, record: FinishedRequest) -> None:
        """Everything vLLM records when a request leaves the engine.

        TTFT is recorded only for requests that produced a token (vLLM records it at the first
        token); per-request TPOT only for outputs longer than one token (decode time over
        completion_tokens - 1, vLLM's definition).
        """
        self.prompt_tokens += record.prompt_tokens
        self.cached_prompt_tokens += record.cached_prompt_tokens
        self.generation_tokens += record.completion_tokens
        self.preemptions += record.preemptions
        # By identity: hashing an Enum member is a Python-level call, twice per request.
        reason = record.finished_reason
        for index, known in enumerate(_REASONS):
            if reason is known:
                self.success[index] += 1
                break
        if record.completion_tokens >= 1:
            self.ttft.observe(record.ttft_s)
        if record.completion_tokens > 1:
            self.tpot.observe(record.decode_s / (record.completion_tokens - 1))
        self.e2e.observe(record.e2e_s)
        self.queue.observe(record.queue_s)
        self.inference.observe(record.prefill_s + record.decode_s)
        self.prefill.observe(record.prefill_s)
        self.decode.observe(record.decode_s)
        self.prompt_tokens_hist.observe(record.prompt_tokens)
        self.generation_tokens_hist.observe(record.completion_tokens)
        self.kv_computed_tokens.observe(record.prompt_tokens - record.cached_prompt_tokens)
        self.max_tokens.observe(record.max_tokens)

    def observe_steps(self, record: EngineSteps) -> None:
        """A run of identical engine steps: one inter-token observation per decoding request
        per step, one iteration-tokens observation per step."""
        if record.iterations <= 0:
            return
        if record.decode_seqs > 0:
            self.itl.observe(record.step_s, record.decode_seqs * record.iterations)
        self.iteration_tokens.observe(record.decode_seqs + record.prefill_tokens, record.iterations)

    def page_values(self, state: ReplicaState | None) -> list[float]:
        """Every sample value of the page, in the order `generate_latest` writes them: per
        family its own samples, then its `_created` samples (the order `families` defines)."""
        created = self.created_s
        values: list[float] = [
            float(state.running if state else 0),
            float(state.waiting if state else 0),
            state.kv_usage_ratio if state else 0.0,
        ]
        for total in (
            self.prompt_tokens,
            self.cached_prompt_tokens,
            self.preemptions,
            self.prompt_tokens,
        ):
            values += (total, created)
        values += (
            self.prompt_tokens - self.cached_prompt_tokens,
            self.cached_prompt_tokens,
            0.0,
            created,
            created,
            created,
            self.generation_tokens,
            created,
        )
        values += self.success
        values += [created] * len(self.success)
        for _, _, counts in self.histograms:
            running = 0
            for n in counts.counts:
                running += n
                values.append(running)
            values += (running, counts.sum, created)
        values += (1.0, 1.0)
        return values

    def families(self, state: ReplicaState | None) -> list[Metric]:
        """The page's metric families, in vLLM's registration order; gauges from `state`."""
        labels = [self.model_name, self.settings.engine]
        sample_labels = dict(zip(ENGINE_LABELS, labels, strict=True))
        created = self.created_s
        out: list[Metric] = []

        running = GaugeMetricFamily(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels=ENGINE_LABELS,
        )
        running.add_metric(labels, float(state.running if state else 0))
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            labels=ENGINE_LABELS,
        )
        waiting.add_metric(labels, float(state.waiting if state else 0))
        kv_usage = GaugeMetricFamily(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            labels=ENGINE_LABELS,
        )
        kv_usage.add_metric(labels, state.kv_usage_ratio if state else 0.0)
        out += [running, waiting, kv_usage]

        def counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, help_text, labels=ENGINE_LABELS)
            family.add_metric(labels, float(value), created=created)
            return family

        out.append(
            counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.prompt_tokens,
            )
        )
        out.append(
            counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.cached_prompt_tokens,
            )
        )
        out.append(
            counter(
                "vllm:num_preemptions",
                "Cumulative number of preemption from the engine.",
                self.preemptions,
            )
        )
        out.append(
            counter("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens)
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=(*ENGINE_LABELS, "source"),
        )
        computed = self.prompt_tokens - self.cached_prompt_tokens
        for source, value in (
            ("local_compute", computed),
            ("local_cache_hit", self.cached_prompt_tokens),
            ("external_kv_transfer", 0),
        ):
            by_source.add_metric([*labels, source], float(value), created=created)
        out.append(by_source)
        out.append(
            counter(
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                self.generation_tokens,
            )
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=(*ENGINE_LABELS, "finished_reason"),
        )
        for reason, value in zip(_REASONS, self.success, strict=True):
            success.add_metric([*labels, reason.value], float(value), created=created)
        out.append(success)

        for name, help_text, counts in self.histograms:
            histogram = HistogramMetricFamily(name, help_text, labels=ENGINE_LABELS)
            histogram.add_metric(labels, counts.cumulative(), counts.sum)
            # prometheus-client's single-process histograms carry `_created` too.
            histogram.add_sample(f"{name}_created", dict(sample_labels), created)
            out.append(histogram)

        config = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig"
        )
        config_labels = {"engine": self.settings.engine, **self.settings.cache_config_labels()}
        config.add_sample("vllm:cache_config_info", config_labels, 1.0)
        out.append(config)
        out.append(
            GaugeMetricFamily(
                EMULATED_GAUGE,
                "1: this page comes from the servewatch emulator, not from a real vLLM server.",
                value=1.0,
            )
        )
        return out


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def encode_families(families: list[Metric]) -> bytes:
    """prometheus-client's text-format 0.0.4 encoding of `families`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


class PageTemplate:
    """A replica's page with the sample values cut out.

    For one model name and engine settings every page has the same lines in the same order;
    only values change. The text between values is taken from prometheus-client's own encoding
    once, and each page then costs one float formatting per sample (about 5x cheaper than
    encoding the families again), so fixture mode can write a day of pages quickly.
    """

    def __init__(self, page: str) -> None:
        chunks: list[str] = []
        pending: list[str] = []
        for line in page.splitlines(keepends=True):
            if line.startswith("#"):
                pending.append(line)
                continue
            prefix, _, _ = line.rstrip("\n").rpartition(" ")
            chunks.append("".join(pending) + prefix + " ")
            pending = ["\n"]
        self.chunks = tuple(chunks)
        self.tail = "".join(pending)

    def render(self, values: Sequence[float]) -> bytes:
        if len(values) != len(self.chunks):
            raise ValueError(
                f"page template has {len(self.chunks)} samples, got {len(values)} values"
            )
        # Whole counts below a million (most values: histogram buckets) print as floatToGoString
        # would, directly. A page repeats some other values many times (`_created` in every
        # family, totals): each is formatted once; not zero, since -0.0 == 0.0 prints otherwise.
        seen: dict[object, str] = {}
        parts: list[str] = []
        append = parts.append
        # As objects: the ints among the values keep their type (a compiled float would not).
        for chunk, value in zip(self.chunks, cast(Sequence[object], values), strict=True):
            append(chunk)
            if type(value) is int:
                if 0 <= value < _GO_PLAIN_BELOW:
                    append(f"{value}.0")
                    continue
            elif type(value) is float:
                # Counts arrive as floats too (compiled code stores them in a list[float]).
                if 0.0 < value < _GO_PLAIN_BELOW and value.is_integer():
                    append(f"{int(value)}.0")
                    continue
                if value == 0.0:
                    append("-0.0" if math.copysign(1.0, value) < 0 else "0.0")
                    continue
            text = seen.get(value)
            if text is None:
                text = _go_float(cast(float, value))
                if value:
                    seen[value] = text
            append(text)
        append(self.tail)
        return "".join(parts).encode()


@functools.lru_cache(maxsize=64)
def page_template(model_name: str, settings: EngineSettings) -> PageTemplate:
    blank = ReplicaMetrics(model_name=model_name, created_s=0.0, settings=settings)
    return PageTemplate(encode_families(blank.families(None)).decode())


def render_vllm_page(metrics: ReplicaMetrics, state: ReplicaState | None) -> bytes:
    """One `/metrics` page of a replica in the Prometheus text format 0.0.4: the same bytes
    as prometheus-client encoding `metrics.families(state)`."""
    template = page_template(metrics.model_name, metrics.settings)
    return template.render(metrics.page_values(state))


def render_page_values(model_name: str, settings: EngineSettings, values: list[float]) -> bytes:
    """The page `VllmMetricsObserver.page_values` describes: the same bytes as `page`."""
    return page_template(model_name, settings).render(values)


class ReplicaCollector(Collector):
    """A prometheus-client collector for one replica of a `VllmMetricsObserver`, for serving
    through prometheus-client's exposition (the live endpoints)."""

    def __init__(self, observer: VllmMetricsObserver, replica: str) -> None:
        self._observer = observer
        self._replica = replica

    def collect(self) -> Iterator[Metric]:
        return iter(self._observer.families(self._replica))


class VllmMetricsObserver:
    """The vLLM metrics of a whole emulated fleet, kept current from simulation records.

    A `STARTED` event starts a new process: counters and histograms restart from zero with a new
    `_created` time (a restart resets them, as Prometheus' `rate` expects). `CRASHED` and
    `HOST_LOST` take the replica down until its next `STARTED`: it has no page meanwhile.
    Safe to call from the simulation's thread while HTTP threads render pages.
    """

    def __init__(
        self,
        placements: Iterable[ReplicaPlacement],
        *,
        started_s: float,
        settings: EngineSettings | None = None,
    ) -> None:
        self.settings = settings or EngineSettings()
        self.placements = {p.replica: p for p in placements}
        self._lock = threading.Lock()
        self._metrics = {
            replica: ReplicaMetrics(model_name=p.model, created_s=started_s, settings=self.settings)
            for replica, p in self.placements.items()
        }
        self._up = dict.fromkeys(self.placements, True)
        self._states: dict[str, ReplicaState] = {}

    def _replica(self, replica: str) -> ReplicaMetrics:
        try:
            return self._metrics[replica]
        except KeyError:
            raise KeyError(
                f"record for replica {replica!r}, which has no placement "
                f"(known: {sorted(self._metrics)})"
            ) from None

    def request_finished(self, record: FinishedRequest) -> None:
        with self._lock:
            self._replica(record.replica).observe_request(record)

    def engine_steps(self, record: EngineSteps) -> None:
        with self._lock:
            self._replica(record.replica).observe_steps(record)

    def replica_event(self, event: ReplicaEvent) -> None:
        with self._lock:
            self._replica(event.replica)
            if event.kind is ReplicaEventKind.STARTED:
                self._metrics[event.replica] = ReplicaMetrics(
                    model_name=event.model or self.placements[event.replica].model,
                    created_s=event.at_s,
                    settings=self.settings,
                )
                self._up[event.replica] = True
            elif event.kind in (ReplicaEventKind.CRASHED, ReplicaEventKind.HOST_LOST):
                self._up[event.replica] = False

    def set_states(self, states: Iterable[ReplicaState]) -> None:
        """The simulation's latest snapshot: gauges, and whether each replica is up."""
        with self._lock:
            for state in states:
                self._states[state.replica] = state

    def is_up(self, replica: str) -> bool:
        with self._lock:
            return self._is_up(replica)

    def _is_up(self, replica: str) -> bool:
        state = self._states.get(replica)
        return self._up[replica] and (state is None or state.up)

    def page(self, replica: str) -> bytes | None:
        """The replica's page now, or None while it is down (its endpoint does not answer)."""
        with self._lock:
            self._replica(replica)
            if not self._is_up(replica):
                return None
            return render_vllm_page(self._metrics[replica], self._states.get(replica))

    def page_values(self, replica: str) -> tuple[str, list[float]] | None:
        """What `page` renders, before rendering: the model name (which picks the template)
        and the sample values; None while the replica is down. Fixture mode renders elsewhere
        (`render_page_values`)."""
        with self._lock:
            self._replica(replica)
            if not self._is_up(replica):
                return None
            metrics = self._metrics[replica]
            return metrics.model_name, metrics.page_values(self._states.get(replica))

    def families(self, replica: str) -> list[Metric]:
        """The replica's metric families now (empty while it is down)."""
        with self._lock:
            self._replica(replica)
            if not self._is_up(replica):
                return []
            return self._metrics[replica].families(self._states.get(replica))

    def registry(self, replica: str) -> CollectorRegistry:
        """A registry holding only this replica's metrics, for prometheus-client's encoders."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ReplicaCollector(self, replica))
        return registry
