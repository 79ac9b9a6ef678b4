"""TensorRT-LLM's Prometheus page of an emulated replica, in its two shapes.

`trtllm-serve` (tensorrt_llm/metrics/collector.py and batch_metrics.py): the `trtllm_` families,
labels `engine_type="trtllm"` and `model_name`, from a single-process prometheus-client registry,
so every counter and histogram child has its `_created` sample; label keys sorted. Upstream
serves it at `/prometheus/metrics` (its `/metrics` is JSON iteration stats).

The early NVIDIA Dynamo TensorRT-LLM worker re-exported TensorRT-LLM's first five families
(request success, end-to-end latency, TTFT, time per output token, queue time) with the prefix
`trtllm:`, `_created` samples included (`dynamo=True`).

Families whose feature the emulated engine does not model (host KV pool, KV transfers,
speculative decoding, perplexity) carry the values of an engine that never used it; labelled
families nothing has touched have their HELP and TYPE lines only, as prometheus-client writes
them.
"""

from __future__ import annotations

import math

from prometheus_client.core import Metric

from servewatch.emulator.page_families import (
    add_counter,
    counter,
    declared,
    emulated_gauge,
    gauge,
    histogram,
    sorted_labels,
)
from servewatch.emulator.records import EngineSteps, FinishedRequest, ReplicaState
from servewatch.emulator.sglang_metrics import process_id
from servewatch.emulator.vllm_metrics import (
    REQUEST_LATENCY_BUCKETS_S,
    TOKEN_LATENCY_BUCKETS_S,
    TTFT_BUCKETS_S,
    BucketCounts,
    EngineSettings,
    encode_families,
)

PROMETHEUS_PATH = "/prometheus/metrics"
ENGINE_TYPE = "trtllm"
PREFILL_TIME_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
    640.0, 2560.0,
)  # fmt: skip
CACHED_TOKENS_BUCKETS = (0.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0)
PREFILL_BATCH_TOKENS_BUCKETS = (
    64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
)  # fmt: skip
SUCCESS_REASONS = ("stop", "length")
ERROR_HTTP_CODE = "500"  # an engine-side failure, what the emulator's errors are
_MAX_ACTIVE_REQUESTS = 256.0
_MAX_BATCH_SIZE = 2048.0
_MAX_NUM_TOKENS = 8192.0
_PROMPT_CACHE_HIT_HELP = (
    "Process-lifetime total prompt tokens served from each KV cache level. Resets only when the "
    "serving process restarts, not when the KV cache is flushed or evicted. cache_level is the "
    "index into the configured tier list and cache_tier names the memory backing it, so a "
    "deployment with a hot and a cold GPU level reports them as two series sharing the gpu "
    "name. Pages already prefetched from disk to host count as host."
)
_SCHEDULED_BATCH_HELP = (
    "Number of real context and generation requests in the latest scheduled batch on this "
    "executor rank; zero when no batch is submitted. Under pipeline parallelism, other "
    "microbatches may still be running."
)


class TrtllmReplicaMetrics:
    """The metric state of one TensorRT-LLM server process (counters from zero at each start).

    `dynamo=True`: the early Dynamo worker page (five `trtllm:` families) instead of
    trtllm-serve's.
    """

    def __init__(
        self,
        *,
        model_name: str,
        created_s: float,
        settings: EngineSettings,
        gpus: int = 1,
        dynamo: bool = False,
    ) -> None:
        self.model_name = model_name
        self.created_s = created_s
        self.settings = settings
        self.gpus = gpus
        self.dynamo = dynamo
        self.pid = process_id(created_s, model_name)
        self.success = dict.fromkeys(SUCCESS_REASONS, 0)
        self.errors = 0
        self.completed = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.reused_blocks = 0
        self.missed_blocks = 0
        self.last_step_s = 0.0
        self.e2e = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.ttft = BucketCounts(TTFT_BUCKETS_S)
        self.tpot = BucketCounts(TOKEN_LATENCY_BUCKETS_S)
        self.queue = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.prefill = BucketCounts(PREFILL_TIME_BUCKETS_S)
        self.decode = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.inference = BucketCounts(REQUEST_LATENCY_BUCKETS_S)
        self.cached_per_request = BucketCounts(CACHED_TOKENS_BUCKETS)
        self.prefill_batch_tokens = BucketCounts(PREFILL_BATCH_TOKENS_BUCKETS)

    def observe_request(self, record: FinishedRequest) -> None:
        """What TensorRT-LLM records for a finished request (perf metrics on): latencies and
        counts for requests that finished with stop or length, an error count otherwise.
        Time per output token is decode time over completion_tokens - 1, as vLLM's."""
        self.completed += 1
        reason = record.finished_reason.value
        if reason not in self.success:
            if reason == "error":
                self.errors += 1
            return
        self.success[reason] += 1
        self.prompt_tokens += record.prompt_tokens
        self.cached_tokens += record.cached_prompt_tokens
        self.generation_tokens += record.completion_tokens
        block = self.settings.block_size
        self.reused_blocks += record.cached_prompt_tokens // block
        self.missed_blocks += math.ceil(
            (record.prompt_tokens - record.cached_prompt_tokens) / block
        )
        self.e2e.observe(record.e2e_s)
        if record.completion_tokens >= 1:
            self.ttft.observe(record.ttft_s)
        if record.completion_tokens > 1:
            self.tpot.observe(record.decode_s / (record.completion_tokens - 1))
        self.queue.observe(record.queue_s)
        self.prefill.observe(record.prefill_s)
        self.decode.observe(record.decode_s)
        self.inference.observe(record.prefill_s + record.decode_s)
        self.cached_per_request.observe(record.cached_prompt_tokens)

    def observe_steps(self, record: EngineSteps) -> None:
        if record.iterations <= 0:
            return
        self.last_step_s = record.step_s
        if record.prefill_tokens > 0:
            self.prefill_batch_tokens.observe(record.prefill_tokens, record.iterations)

    def _core_families(self, labels: dict[str, str], prefix: str) -> list[Metric]:
        created = self.created_s
        success = Metric(
            f"{prefix}request_success", "Count of successfully processed requests.", "counter"
        )
        for reason, value in self.success.items():
            add_counter(success, {**labels, "finished_reason": reason}, value, created_s=created)
        out = [success]
        for name, text, counts in (
            (
                "e2e_request_latency_seconds",
                "Histogram of end to end request latency in seconds.",
                self.e2e,
            ),
            (
                "time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
                self.tpot,
            ),
            (
                "request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                self.queue,
            ),
        ):
            out.append(
                histogram(
                    f"{prefix}{name}", text, [(labels, counts)], sum_first=False, created_s=created
                )
            )
        return out

    def families(self, state: ReplicaState | None) -> list[Metric]:
        labels = {"engine_type": ENGINE_TYPE, "model_name": self.model_name}
        if self.dynamo:
            return [*self._core_families(labels, "trtllm:"), emulated_gauge("TensorRT-LLM")]
        created = self.created_s
        running = float(state.running if state else 0)
        waiting = float(state.waiting if state else 0)
        usage = state.kv_usage_ratio if state else 0.0
        max_blocks = self.settings.num_gpu_blocks
        used_blocks = round(usage * max_blocks)
        hit_rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

        def total(name: str, text: str, value: float) -> Metric:
            return counter(name, text, labels, value, created_s=created)

        def plain(name: str, text: str, value: float) -> Metric:
            return gauge(name, text, labels, value)

        out = self._core_families(labels, "trtllm_")
        for name, text, counts in (
            (
                "trtllm_request_prefill_time_seconds",
                (
                    "Histogram of prefill (context) phase duration in seconds "
                    "(first_token_time - first_scheduled_time)."
                ),
                self.prefill,
            ),
            (
                "trtllm_request_decode_time_seconds",
                (
                    "Histogram of decode (generation) phase duration in seconds "
                    "(last_token_time - first_token_time)."
                ),
                self.decode,
            ),
            (
                "trtllm_request_inference_time_seconds",
                (
                    "Histogram of total inference duration in seconds "
                    "(last_token_time - first_scheduled_time)."
                ),
                self.inference,
            ),
        ):
            out.append(
                histogram(name, text, [(labels, counts)], sum_first=False, created_s=created)
            )
        out += [
            total(
                "trtllm_prompt_tokens_total",
                "Cumulative number of prompt (input) tokens processed.",
                self.prompt_tokens,
            ),
            total(
                "trtllm_generation_tokens_total",
                "Cumulative number of generation (output) tokens produced.",
                self.generation_tokens,
            ),
            plain("trtllm_kv_cache_hit_rate", "KV cache hit rate", hit_rate),
            total(
                "trtllm_kv_cache_reused_blocks",
                "Cumulative number of KV cache blocks reused (cache hits)",
                self.reused_blocks,
            ),
            total(
                "trtllm_kv_cache_missed_blocks",
                "Cumulative number of KV cache blocks missed (cache misses)",
                self.missed_blocks,
            ),
            plain("trtllm_kv_cache_utilization", "KV cache utilization", usage),
            declared(
                "trtllm_kv_cache_host_utilization",
                "KV cache host (secondary) pool utilization",
                "gauge",
            ),
            plain(
                "trtllm_kv_cache_iter_reuse_rate",
                "Per-iteration KV cache block reuse rate",
                hit_rate,
            ),
            total(
                "trtllm_kv_cache_iter_reused_blocks",
                "Total reused KV cache blocks (full + partial)",
                self.reused_blocks,
            ),
            total(
                "trtllm_kv_cache_iter_full_reused_blocks",
                "Total fully reused KV cache blocks",
                self.reused_blocks,
            ),
            total(
                "trtllm_kv_cache_iter_partial_reused_blocks",
                "Total partially reused KV cache blocks",
                0.0,
            ),
            total(
                "trtllm_kv_cache_iter_missed_blocks",
                "Total missed KV cache blocks (context phase)",
                self.missed_blocks,
            ),
            total(
                "trtllm_kv_cache_gen_alloc_blocks",
                "Total blocks allocated during generation phase",
                self.generation_tokens // self.settings.block_size,
            ),
            total(
                "trtllm_kv_cache_onboard_bytes",
                "Total bytes transferred from host to GPU (onboard)",
                0.0,
            ),
            total(
                "trtllm_kv_cache_offload_bytes",
                "Total bytes transferred from GPU to host (offload)",
                0.0,
            ),
            total(
                "trtllm_kv_cache_disk_prefetch_blocks",
                "Process-lifetime total V2 KV-cache blocks migrated from disk to host by the "
                "prefetch mechanism. Resets only when the serving process restarts.",
                0.0,
            ),
            total(
                "trtllm_kv_cache_intra_device_copy_bytes",
                "Total bytes copied within GPU (intra-device block copies)",
                0.0,
            ),
            plain("trtllm_num_requests_running", "Number of active requests", running),
            plain("trtllm_num_requests_waiting", "Number of queued requests", waiting),
            total(
                "trtllm_num_requests_completed",
                "Total number of completed requests across iterations",
                self.completed,
            ),
            plain(
                "trtllm_max_num_active_requests",
                "Maximum number of active requests",
                _MAX_ACTIVE_REQUESTS,
            ),
            plain(
                "trtllm_iteration_latency_seconds", "Iteration latency in seconds", self.last_step_s
            ),
            plain("trtllm_gpu_memory_usage_bytes", "GPU memory usage in bytes", 0.0),
            plain("trtllm_cpu_memory_usage_bytes", "CPU memory usage in bytes", 0.0),
            plain("trtllm_pinned_memory_usage_bytes", "Pinned memory usage in bytes", 0.0),
            plain("trtllm_max_batch_size_static", "Static maximum batch size", _MAX_BATCH_SIZE),
            plain("trtllm_max_batch_size_runtime", "Runtime maximum batch size", _MAX_BATCH_SIZE),
            plain(
                "trtllm_max_num_tokens_runtime",
                "Runtime maximum number of tokens",
                _MAX_NUM_TOKENS,
            ),
            plain(
                "trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", float(max_blocks)
            ),
            plain(
                "trtllm_kv_cache_free_blocks",
                "Number of free KV cache blocks",
                float(max_blocks - used_blocks),
            ),
            plain(
                "trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", float(used_blocks)
            ),
            plain(
                "trtllm_kv_cache_tokens_per_block",
                "Number of tokens per KV cache block",
                float(self.settings.block_size),
            ),
            plain("trtllm_num_context_requests", "Number of context (prefill) requests", 0.0),
            plain(
                "trtllm_num_generation_requests", "Number of generation (decode) requests", running
            ),
            plain("trtllm_num_paused_requests", "Number of paused requests", 0.0),
            plain("trtllm_num_scheduled_requests", "Number of scheduled requests", running),
            plain("trtllm_total_context_tokens", "Total number of context tokens", 0.0),
            plain(
                "trtllm_avg_decoded_tokens_per_iter",
                "Average number of decoded tokens per iteration",
                1.0,
            ),
            declared(
                "trtllm_spec_decode_num_draft_tokens_total",
                "Total number of draft tokens in speculative decoding",
                "counter",
            ),
            declared(
                "trtllm_spec_decode_num_accepted_tokens_total",
                "Total number of accepted tokens in speculative decoding",
                "counter",
            ),
            declared(
                "trtllm_spec_decode_acceptance_length",
                "Acceptance length in speculative decoding",
                "gauge",
            ),
            declared(
                "trtllm_spec_decode_draft_overhead",
                "Draft overhead in speculative decoding",
                "gauge",
            ),
            total(
                "trtllm_prompt_cached_tokens_total",
                "Process-lifetime total prompt tokens served from KV cache. Resets only when the "
                "serving process restarts, not when the KV cache is flushed or evicted.",
                self.cached_tokens,
            ),
        ]
        cache_hits = Metric("trtllm_prompt_cache_hit_tokens", _PROMPT_CACHE_HIT_HELP, "counter")
        add_counter(
            cache_hits,
            {**labels, "cache_level": "0", "cache_tier": "gpu"},
            self.cached_tokens,
            created_s=created,
        )
        out.append(cache_hits)
        out.append(
            histogram(
                "trtllm_prompt_cached_tokens_per_request",
                "Histogram of cached prompt tokens per request.",
                [(labels, self.cached_per_request)],
                sum_first=False,
                created_s=created,
            )
        )
        out += [
            declared(
                "trtllm_spec_decode_drafted_tokens_total",
                "Total drafted tokens per speculative decoding position.",
                "counter",
            ),
            declared(
                "trtllm_spec_decode_accepted_tokens_total",
                "Total accepted tokens per speculative decoding position.",
                "counter",
            ),
            declared(
                "trtllm_prefill_perplexity",
                "Histogram of prefill perplexity per request.",
                "histogram",
            ),
            declared(
                "trtllm_generation_perplexity",
                "Histogram of generation perplexity per request.",
                "histogram",
            ),
            plain(
                "trtllm_prefill_batch_occupancy",
                "Fraction of max active slots occupied by context requests.",
                0.0,
            ),
            histogram(
                "trtllm_prefill_batch_tokens",
                "Histogram of total context tokens per iteration.",
                [(labels, self.prefill_batch_tokens)],
                sum_first=False,
                created_s=created,
            ),
        ]
        errors = Metric(
            "trtllm_request_error", "Total request errors, labeled by HTTP status code.", "counter"
        )
        add_counter(
            errors, {**labels, "http_code": ERROR_HTTP_CODE}, self.errors, created_s=created
        )
        out.append(errors)
        out.append(
            gauge(
                "trtllm_scheduled_batch_size",
                _SCHEDULED_BATCH_HELP,
                {**labels, "pid": self.pid, "rank": "0"},
                running,
            )
        )
        for name, text, info in (
            (
                "trtllm_model_config_info",
                "Model configuration info",
                {"dtype": "bfloat16", "model": self.model_name, "quantization": "none"},
            ),
            (
                "trtllm_parallel_config_info",
                "Parallelism configuration info",
                {"pp_size": "1", "tp_size": str(self.gpus)},
            ),
            (
                "trtllm_kv_cache_config_info",
                "KV cache configuration info",
                {"enable_block_reuse": "True", "page_size": str(self.settings.block_size)},
            ),
        ):
            family = Metric(name, text, "gauge")
            family.add_sample(name, sorted_labels({**labels, **info}), 1.0)
            out.append(family)
        out.append(emulated_gauge("TensorRT-LLM"))
        return out

    def page(self, state: ReplicaState | None) -> bytes:
        return encode_families(self.families(state))
