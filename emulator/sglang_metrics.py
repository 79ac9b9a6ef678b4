"""SGLang's `/metrics` page of an emulated replica (the `sglang:` families).

Names, help texts, labels and default buckets follow SGLang's collectors
(python/sglang/srt/metrics/collector.py and func_timer.py): scheduler families carry
`engine_type, model_name, moe_ep_rank, pp_rank, tp_rank`, tokenizer families `model_name` only,
and the page is prometheus-client's multiprocess exposition (SGLang sets
PROMETHEUS_MULTIPROC_DIR with --enable-metrics): sorted label keys, `_sum` before the buckets,
no `_created` samples, a `pid` label on the gauges kept per process.

What the emulated engine knows fills the families that mean it: running and queued requests,
token usage of the KV pool, token counters, the prefix-cache hit rate, queue time, TTFT,
inter-token latency, end-to-end latency and the per-stage split. Every other family of the
page (grammar, LoRA, disaggregation, HiCache, speculative decoding) is there with the values an
engine that never used the feature reports, so the page has SGLang's full family set.
"""

from __future__ import annotations

import zlib

from prometheus_client.core import Metric

from servewatch.emulator.page_families import (
    add_counter,
    counter,
    emulated_gauge,
    exponential_buckets,
    gauge,
    histogram,
    sorted_labels,
)
from servewatch.emulator.records import EngineSteps, FinishedRequest, ReplicaState
from servewatch.emulator.vllm_metrics import BucketCounts, EngineSettings, encode_families

ENGINE_TYPE = "unified"  # neither side of a prefill/decode split
QUEUE_TIME_BUCKETS_S = (
    0.0, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0,
    80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0, 1000.0, 1200.0,
    1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0,
)  # fmt: skip
TTFT_BUCKETS_S = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
    400.0, 600.0, 1200.0, 1800.0, 2400.0,
)  # fmt: skip
TOKEN_LENGTH_BUCKETS = (
    100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0, 7000.0,
    8000.0, 9000.0, 10000.0, 12000.0, 15000.0, 20000.0, 22000.0, 25000.0, 30000.0, 35000.0,
    40000.0, 66000.0, 99000.0, 132000.0, 300000.0, 600000.0, 900000.0, 1100000.0,
)  # fmt: skip
RETRACTION_BUCKETS = (
    0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0,
    75.0, 100.0,
)  # fmt: skip
STAGE_BUCKETS_S = exponential_buckets(0.001, 1.62, 30)
FUNC_LATENCY_BUCKETS_S = exponential_buckets(0.05, 1.5, 18)
STAGES = ("prefill_waiting", "prefill_forward", "decode_forward")
_GRAMMAR_TIME_BUCKETS_S = (
    0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 90.0, 120.0, 240.0,
)  # fmt: skip
_TRAVERSAL_BUCKETS_S = (
    0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 90.0, 120.0, 240.0,
)  # fmt: skip
_SCHEMA_COUNT_BUCKETS = (
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 100.0, 120.0, 140.0, 160.0, 180.0,
    200.0, 300.0, 400.0, 500.0, 700.0, 1000.0,
)  # fmt: skip
_EBNF_SIZE_BUCKETS = (
    0.0, 50.0, 100.0, 200.0, 300.0, 500.0, 1000.0, 2000.0, 3000.0, 5000.0, 10000.0, 20000.0,
    30000.0, 50000.0, 100000.0,
)  # fmt: skip
_PREFILL_DELAYER_PASSES = (0.0, 5.0, 20.0, 29.0)  # the default max_delay of 30 passes
_PREFILL_DELAYER_WAIT_S = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0)
_PAGES_BUCKETS = (1.0, 5.0, 10.0, 50.0, 100.0)
_BANDWIDTH_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 50.0, 100.0)
_CACHE_MOVE_BUCKETS_S = (
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01, 0.02, 0.03, 0.04, 0.05,
    0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
_ROUTING_KEY_BOUNDS = ("1", "2", "3", "5", "7", "10", "20", "50", "100", "200", "+Inf")
_DEFAULT_MAX_LORAS = 8.0  # server_args.max_loras_per_batch

# Scheduler gauges with no emulated counterpart: (name, help, value), in SGLang's order.
_IDLE_GAUGES_A = (
    ("sglang:pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet).", 0.0),  # noqa: E501
    ("sglang:swa_token_usage", "The token usage for SWA layers.", 0.0),
    ("sglang:mamba_usage", "The token usage for Mamba layers.", 0.0),
)  # fmt: skip
_IDLE_GAUGES_B = (
    ("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", 0.0),
    ("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch).", 0.0),  # noqa: E501
    ("sglang:num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue.", 0.0),  # noqa: E501
    ("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.", 0.0),  # noqa: E501
    ("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.", 0.0),  # noqa: E501
    ("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.", 0.0),  # noqa: E501
    ("sglang:kv_transfer_speed_gb_s", "The transfer speed of the KV cache in GB/s.", 0.0),
    ("sglang:kv_transfer_latency_ms", "The transfer latency of the KV cache in ms.", 0.0),
    ("sglang:kv_transfer_bootstrap_ms", "The bootstrap time of the KV transfer in ms.", 0.0),
    ("sglang:kv_transfer_alloc_ms", "The allocation waiting time of the KV transfer in ms.", 0.0),
    ("sglang:kv_transfer_total_mb", "The total number of tokens transferred in the KV cache.", 0.0),
)  # fmt: skip
_IDLE_GAUGES_C = (
    ("sglang:max_running_requests_under_SLO", "The maximum number of running requests under SLO.", 0.0),  # noqa: E501
    ("sglang:engine_startup_time", "The time taken for the engine to start up.", 0.0),
    ("sglang:engine_load_weights_time", "The time taken for the engine to load weights.", 0.0),
    ("sglang:is_cuda_graph", "Whether the batch is using CUDA graph.", 1.0),
    ("sglang:lora_pool_slots_used", "Number of LoRA adapter slots currently occupied in GPU memory.", 0.0),  # noqa: E501
    ("sglang:lora_pool_slots_total", "Total number of LoRA adapter slots available (max_loras_per_batch).", _DEFAULT_MAX_LORAS),  # noqa: E501
    ("sglang:lora_pool_utilization", "LoRA pool utilization ratio (used/total). 1.0 means pool is full.", 0.0),  # noqa: E501
    ("sglang:num_unique_running_routing_keys", "Number of unique routing keys in running batch.", 0.0),  # noqa: E501
)  # fmt: skip
# Scheduler histograms the emulated engine never observes: (name, help, buckets).
_IDLE_HISTOGRAMS_A = (
    ("sglang:grammar_compilation_time_seconds", "Histogram of grammar compilation time in seconds.", _GRAMMAR_TIME_BUCKETS_S),  # noqa: E501
    ("sglang:grammar_schema_count", "Histogram of grammar schema count.", _SCHEMA_COUNT_BUCKETS),
    ("sglang:grammar_ebnf_size", "Histogram of grammar EBNF size.", _EBNF_SIZE_BUCKETS),
    ("sglang:grammar_tree_traversal_time_avg", "Histogram of average grammar tree traversal time in seconds.", _TRAVERSAL_BUCKETS_S),  # noqa: E501
    ("sglang:grammar_tree_traversal_time_max", "Histogram of max grammar tree traversal time in seconds.", _TRAVERSAL_BUCKETS_S),  # noqa: E501
)  # fmt: skip
_IDLE_HISTOGRAMS_B = (
    ("sglang:prefill_delayer_wait_forward_passes", "Histogram of forward passes waited by prefill delayer.", _PREFILL_DELAYER_PASSES),  # noqa: E501
    ("sglang:prefill_delayer_wait_seconds", "Histogram of wait time in seconds by prefill delayer.", _PREFILL_DELAYER_WAIT_S),  # noqa: E501
)  # fmt: skip
_IDLE_HISTOGRAMS_C = (
    ("sglang:prefetch_pgs", "Histogram of prefetch pages of batches.", _PAGES_BUCKETS),
    ("sglang:backup_pgs", "Histogram of backup pages of batches.", _PAGES_BUCKETS),
    ("sglang:prefetch_bandwidth", "Histogram of prefetch bandwidth in GB/s.", _BANDWIDTH_BUCKETS),
    ("sglang:backup_bandwidth", "Histogram of backup bandwidth in GB/s.", _BANDWIDTH_BUCKETS),
    ("sglang:eviction_duration_seconds", "Time taken to evict memory from GPU to CPU in seconds.", _CACHE_MOVE_BUCKETS_S),  # noqa: E501
    ("sglang:load_back_duration_seconds", "Time taken to load memory from CPU to GPU in seconds.", _CACHE_MOVE_BUCKETS_S),  # noqa: E501
)  # fmt: skip
_IDLE_COUNTERS_A = (
    ("sglang:num_bootstrap_failed_reqs_total", "The number of bootstrap failed requests."),
    ("sglang:num_transfer_failed_reqs_total", "The number of transfer failed requests."),
    ("sglang:num_grammar_cache_hit_total", "Number of grammar cache hits."),
    ("sglang:num_grammar_aborted_total", "Number of grammar aborted requests."),
    ("sglang:num_grammar_timeout_total", "Number of grammar timeouts."),
    ("sglang:num_grammar_total", "Number of the total grammar requests."),
)
_IDLE_COUNTERS_B = (
    ("sglang:prefetched_tokens_total", "Number of prefetched prompt tokens."),
    ("sglang:backuped_tokens_total", "Number of backuped tokens."),
    ("sglang:evicted_tokens_total", "The number of tokens evicted from GPU to CPU."),
    ("sglang:load_back_tokens_total", "The number of tokens loaded from CPU to GPU."),
)


def process_id(created_s: float, model_name: str) -> str:
    """A stable stand-in for the scheduler's pid: a new one for every (re)start."""
    return str(300 + zlib.crc32(f"{model_name}@{created_s!r}".encode()) % 4_000_000)


class SglangReplicaMetrics:
    """The metric state of one SGLang server process (counters from zero at each start)."""

    def __init__(
        self, *, model_name: str, created_s: float, settings: EngineSettings, gpus: int = 1
    ) -> None:
        self.model_name = model_name
        self.created_s = created_s
        self.settings = settings
        self.gpus = gpus
        self.pid = process_id(created_s, model_name)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.aborted = 0
        self.retracted = 0
        self.decode_passes = 0
        self.extend_passes = 0
        self.decode_gpu_s = 0.0
        self.extend_gpu_s = 0.0
        self.queue = BucketCounts(QUEUE_TIME_BUCKETS_S)
        self.stages = {stage: BucketCounts(STAGE_BUCKETS_S) for stage in STAGES}
        self.ttft = BucketCounts(TTFT_BUCKETS_S)
        self.itl = BucketCounts(ITL_BUCKETS_S)
        self.e2e = BucketCounts(E2E_BUCKETS_S)
        self.prompt_hist = BucketCounts(TOKEN_LENGTH_BUCKETS)
        self.generation_hist = BucketCounts(TOKEN_LENGTH_BUCKETS)
        self.retractions = BucketCounts(RETRACTION_BUCKETS)
        self.func_latency = BucketCounts(FUNC_LATENCY_BUCKETS_S)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.settings.num_gpu_blocks * self.settings.block_size

    def observe_request(self, record: FinishedRequest) -> None:
        """What SGLang's tokenizer and scheduler record when a request finishes."""
        self.prompt_tokens += record.prompt_tokens
        self.cached_tokens += record.cached_prompt_tokens
        self.generation_tokens += record.completion_tokens
        self.requests += 1
        self.aborted += record.finished_reason.value == "abort"
        self.retracted += record.preemptions
        self.queue.observe(record.queue_s)
        for stage, seconds in zip(
            STAGES, (record.queue_s, record.prefill_s, record.decode_s), strict=True
        ):
            self.stages[stage].observe(seconds)
        if record.completion_tokens >= 1:
            self.ttft.observe(record.ttft_s)
        self.e2e.observe(record.e2e_s)
        self.func_latency.observe(record.e2e_s)
        self.prompt_hist.observe(record.prompt_tokens)
        self.generation_hist.observe(record.completion_tokens)
        self.retractions.observe(record.preemptions)

    def observe_steps(self, record: EngineSteps) -> None:
        """One inter-token observation per decoding request per step, as vLLM's; GPU time by
        forward mode (a step computing prompt tokens is an extend pass)."""
        if record.iterations <= 0:
            return
        if record.decode_seqs > 0:
            self.itl.observe(record.step_s, record.decode_seqs * record.iterations)
        busy_s = record.step_s * record.iterations
        if record.prefill_tokens > 0:
            self.extend_passes += record.iterations
            self.extend_gpu_s += busy_s
        else:
            self.decode_passes += record.iterations
            self.decode_gpu_s += busy_s

    def families(self, state: ReplicaState | None) -> list[Metric]:
        """The page's families in the order SGLang's multiprocess collector writes them."""
        scheduler = {
            "engine_type": ENGINE_TYPE,
            "model_name": self.model_name,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        tokenizer = {"model_name": self.model_name}
        with_pid = {**scheduler, "pid": self.pid}
        running = float(state.running if state else 0)
        waiting = float(state.waiting if state else 0)
        usage = state.kv_usage_ratio if state else 0.0
        used_tokens = float(round(usage * self.kv_capacity_tokens))
        hit_rate = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        out: list[Metric] = [
            gauge("sglang:num_retracted_reqs", "The number of retracted requests.", with_pid, 0.0),
            gauge(
                "sglang:num_paused_reqs",
                "The number of paused requests by async weight sync.",
                with_pid,
                0.0,
            ),
            gauge(
                "sglang:prefetch_occupied_ratio",
                "Current prefetch occupied ratio (0-1, >1 means rate limited).",
                with_pid,
                0.0,
            ),
            gauge("sglang:num_running_reqs", "The number of running requests.", scheduler, running),
            gauge("sglang:num_used_tokens", "The number of used tokens.", scheduler, used_tokens),
            gauge("sglang:token_usage", "The token usage.", scheduler, usage),
        ]
        out += [gauge(name, text, scheduler, value) for name, text, value in _IDLE_GAUGES_A]
        out += [
            gauge(
                "sglang:decode_sum_seq_lens",
                "The sum of all sequence lengths in decode.",
                scheduler,
                used_tokens,
            ),
            gauge(
                "sglang:gen_throughput",
                "The generation throughput (token/s).",
                scheduler,
                state.tokens_per_s if state else 0.0,
            ),
            gauge(
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                scheduler,
                waiting,
            ),
            gauge(
                "sglang:num_grammar_queue_reqs",
                "The number of requests in the grammar waiting queue.",
                scheduler,
                0.0,
            ),
            gauge(
                "sglang:num_running_reqs_offline_batch",
                "The number of running low-priority offline batch requests(label is 'batch').",
                scheduler,
                0.0,
            ),
            gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", scheduler, hit_rate),
            gauge(
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                scheduler,
                float(self.kv_capacity_tokens),
            ),
        ]
        out += [gauge(name, text, scheduler, value) for name, text, value in _IDLE_GAUGES_B]
        out.append(
            gauge(
                "sglang:utilization",
                "The utilization.",
                scheduler,
                state.busy_ratio if state else 0.0,
            )
        )
        out += [gauge(name, text, scheduler, value) for name, text, value in _IDLE_GAUGES_C]
        for name, text in (
            (
                "sglang:routing_key_running_req_count",
                "Distribution of routing keys by running request count (gt < count <= le).",
            ),
            (
                "sglang:routing_key_all_req_count",
                "Distribution of routing keys by running+waiting request count (gt < count <= le).",
            ),
        ):
            # A gauge per (gt, le] range, not a cumulative histogram: SGLang's GaugeHistogram.
            family = Metric(name, text, "gauge")
            for low, high in zip(
                ("0", *_ROUTING_KEY_BOUNDS[:-1]), _ROUTING_KEY_BOUNDS, strict=True
            ):
                family.add_sample(name, sorted_labels({**scheduler, "gt": low, "le": high}), 0.0)
            out.append(family)
        out.append(gauge("sglang:new_token_ratio", "The new token ratio.", scheduler, 0.0))
        balancedness = Metric(
            "sglang:eplb_balancedness", "Balancedness of MoE in expert parallelism.", "summary"
        )
        eplb_labels = sorted_labels({**scheduler, "forward_mode": "decode"})
        balancedness.add_sample("sglang:eplb_balancedness_count", eplb_labels, 0.0)
        balancedness.add_sample("sglang:eplb_balancedness_sum", dict(eplb_labels), 0.0)
        out.append(balancedness)

        def scheduler_histogram(name: str, text: str, counts: BucketCounts) -> Metric:
            return histogram(name, text, [(scheduler, counts)], sum_first=True)

        out.append(
            scheduler_histogram(
                "sglang:queue_time_seconds", "Histogram of queueing time in seconds.", self.queue
            )
        )
        out += [
            scheduler_histogram(name, text, BucketCounts(bounds))
            for name, text, bounds in _IDLE_HISTOGRAMS_A
        ]
        out.append(
            histogram(
                "sglang:per_stage_req_latency_seconds",
                "The latency of each stage of requests.",
                [({**scheduler, "stage": stage}, self.stages[stage]) for stage in STAGES],
                sum_first=True,
            )
        )
        out += [
            scheduler_histogram(name, text, BucketCounts(bounds))
            for name, text, bounds in _IDLE_HISTOGRAMS_B
        ]
        for name, text, counts in (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "sglang:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                self.itl,
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                self.e2e,
            ),
            (
                "sglang:prompt_tokens_histogram",
                "Histogram of prompt token length.",
                self.prompt_hist,
            ),
            (
                "sglang:generation_tokens_histogram",
                "Histogram of generation token length.",
                self.generation_hist,
            ),
            (
                "sglang:num_retractions",
                "Histogram of retraction counts per request.",
                self.retractions,
            ),
        ):
            out.append(histogram(name, text, [(tokenizer, counts)], sum_first=True))
        out += [
            scheduler_histogram(name, text, BucketCounts(bounds))
            for name, text, bounds in _IDLE_HISTOGRAMS_C
        ]
        out.append(
            histogram(
                "sglang:func_latency_seconds",
                "Function latency in seconds",
                [({"name": "generate_request"}, self.func_latency)],
                sum_first=True,
            )
        )
        out += [
            counter(
                "sglang:num_retracted_requests_total",
                "Total number of retracted requests.",
                scheduler,
                self.retracted,
            ),
            counter(
                "sglang:num_retracted_input_tokens_total",
                "Total number of retracted input tokens.",
                scheduler,
                0.0,
            ),
            counter(
                "sglang:num_retracted_output_tokens_total",
                "Total number of retracted output tokens.",
                scheduler,
                0.0,
            ),
        ]
        out += [counter(name, text, scheduler, 0.0) for name, text in _IDLE_COUNTERS_A]
        for name, text, key, children in (
            (
                "sglang:cuda_graph_passes",
                "Total number of forward passes categorized by CUDA graph.",
                "mode",
                (("decode_cuda_graph", self.decode_passes), ("decode_none", self.extend_passes)),
            ),
            (
                "sglang:realtime_tokens",
                (
                    "Total number of tokens processed (updated on each log interval). "
                    "mode: prefill_compute, prefill_cache, decode."
                ),
                "mode",
                (
                    ("prefill_compute", self.prompt_tokens - self.cached_tokens),
                    ("prefill_cache", self.cached_tokens),
                    ("decode", self.generation_tokens),
                ),
            ),
            (
                "sglang:gpu_execution_seconds",
                (
                    "Total time that GPU is busy executing a workload. "
                    "Refer to ForwardMode for category labels."
                ),
                "category",
                (("extend", self.extend_gpu_s), ("decode", self.decode_gpu_s)),
            ),
        ):
            family = Metric(name, text, "counter")
            for value_label, value in children:
                add_counter(family, {**scheduler, key: value_label}, value)
            out.append(family)
        out += [
            counter(
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                tokenizer,
                self.prompt_tokens,
            ),
            counter(
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                tokenizer,
                self.generation_tokens,
            ),
            counter(
                "sglang:cached_tokens_total",
                "Number of cached prompt tokens.",
                tokenizer,
                self.cached_tokens,
            ),
            counter(
                "sglang:num_requests_total",
                "Number of requests processed.",
                tokenizer,
                self.requests,
            ),
            counter(
                "sglang:num_so_requests_total",
                "Number of structured output requests processed.",
                tokenizer,
                0.0,
            ),
            counter(
                "sglang:num_aborted_requests_total",
                "Number of requests aborted.",
                tokenizer,
                self.aborted,
            ),
        ]
        out += [counter(name, text, scheduler, 0.0) for name, text in _IDLE_COUNTERS_B]
        out.append(emulated_gauge("SGLang"))
        return out

    def page(self, state: ReplicaState | None) -> bytes:
        return encode_families(self.families(state))
