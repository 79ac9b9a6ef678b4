"""Canonical signals: the names collectors map raw metric names onto.

A signal is one quantity in one unit, whichever vLLM or DCGM version exposed it and under
whichever name. `SIGNALS` gives each its unit, metric type and how the series of one replica
combine (data-parallel engines for vLLM, tensor-parallel GPUs for DCGM). Points are stored in
the signal's unit, so nothing downstream needs to know which exporter version wrote them:

    time: seconds          memory: bytes        clocks: hertz       energy: joules
    power: watts           temperature: Celsius utilisation and activity: ratio 0-1
    throughput: bytes/s    counts: tokens, requests or events

Catalogues, which map exposed sample names onto these signals, live in collectors/
(`collectors/metrics/catalogue.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

import polars as pl


class Unit(StrEnum):
    SECONDS = "s"
    TOKENS = "tokens"
    REQUESTS = "requests"
    EVENTS = "events"
    RATIO = "ratio"
    HERTZ = "Hz"
    CELSIUS = "Celsius"
    WATTS = "W"
    JOULES = "J"
    BYTES = "bytes"
    BYTES_PER_SECOND = "bytes/s"
    ITEMS = "items"  # multi-modal inputs
    REPLICAS = "replicas"  # serving replicas (pods)
    FLOPS = "flop"  # floating-point operations
    TOKENS_PER_SECOND = "tokens/s"
    UNIX_TIME = "unix s"  # a point in time, seconds since the epoch
    CODE = "code"  # an identifier (an XID number), not a quantity
    FLAG = "flag"  # 0 or 1
    INFO = "info"  # always 1; the labels carry the data


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    INFO = "info"


class Aggregation(StrEnum):
    """How the series of one replica combine into one (engines under DP, GPUs under TP)."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    NONE = "none"  # not combinable (configuration info)


class Source(StrEnum):
    """Who emitted a sample. Router re-exports are never summed with engine metrics."""

    VLLM_ENGINE = "vllm_engine"
    VLLM_ROUTER = "vllm_router"
    SGLANG_ENGINE = "sglang_engine"
    TRTLLM_ENGINE = "trtllm_engine"
    TGI_SERVER = "tgi_server"
    LLAMACPP_SERVER = "llamacpp_server"
    DCGM = "dcgm"
    # The endpoint picker of a Gateway API inference gateway (EPP, llm-d): it routes and sheds
    # requests for a pool, so its counts are the pool's front door, never a replica's.
    INFERENCE_GATEWAY = "inference_gateway"


# Who serves requests: their series are an engine's own (router re-exports are not).
ENGINE_SOURCES: tuple[Source, ...] = (
    Source.VLLM_ENGINE,
    Source.SGLANG_ENGINE,
    Source.TRTLLM_ENGINE,
    Source.TGI_SERVER,
    Source.LLAMACPP_SERVER,
)


class Signal(StrEnum):
    # vLLM scheduler state
    REQUESTS_RUNNING = "requests_running"
    REQUESTS_WAITING = "requests_waiting"
    REQUESTS_WAITING_BY_REASON = "requests_waiting_by_reason"
    KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"
    # vLLM counters
    PREFIX_CACHE_QUERIES_TOKENS = "prefix_cache_queries_tokens"
    PREFIX_CACHE_HITS_TOKENS = "prefix_cache_hits_tokens"
    PROMPT_TOKENS = "prompt_tokens"
    PROMPT_TOKENS_BY_SOURCE = "prompt_tokens_by_source"
    GENERATION_TOKENS = "generation_tokens"
    PREEMPTIONS = "preemptions"
    REQUESTS_FINISHED = "requests_finished"
    ADMISSION_REJECTIONS = "admission_rejections"
    # vLLM latency histograms
    TTFT_S = "ttft_s"
    INTER_TOKEN_LATENCY_S = "inter_token_latency_s"  # noqa: S105 (a signal, not a secret)
    REQUEST_TPOT_S = "request_tpot_s"
    E2E_LATENCY_S = "e2e_latency_s"
    QUEUE_TIME_S = "queue_time_s"
    PREFILL_TIME_S = "prefill_time_s"
    DECODE_TIME_S = "decode_time_s"
    INFERENCE_TIME_S = "inference_time_s"
    # vLLM length histograms
    REQUEST_PROMPT_TOKENS = "request_prompt_tokens"
    REQUEST_GENERATION_TOKENS = "request_generation_tokens"
    REQUEST_PREFILL_KV_COMPUTED_TOKENS = "request_prefill_kv_computed_tokens"
    ITERATION_TOKENS = "iteration_tokens"
    # vLLM configuration
    CACHE_CONFIG_INFO = "cache_config_info"
    # engine state and counters beyond the core set (vLLM V1 loggers, V0, other engines)
    PREFIX_CACHE_HIT_RATIO = "prefix_cache_hit_ratio"
    CPU_PREFIX_CACHE_HIT_RATIO = "cpu_prefix_cache_hit_ratio"
    CPU_KV_CACHE_USAGE_RATIO = "cpu_kv_cache_usage_ratio"
    REQUESTS_SWAPPED = "requests_swapped"
    PROMPT_THROUGHPUT_TOKENS_PER_S = "prompt_throughput_tokens_per_s"
    GENERATION_THROUGHPUT_TOKENS_PER_S = "generation_throughput_tokens_per_s"
    PROMPT_TOKENS_CACHED = "prompt_tokens_cached"
    PROMPT_TOKENS_CACHED_BY_SOURCE = "prompt_tokens_cached_by_source"
    PROMPT_TOKENS_RECOMPUTED = "prompt_tokens_recomputed"
    EXTERNAL_PREFIX_CACHE_QUERIES_TOKENS = "external_prefix_cache_queries_tokens"
    EXTERNAL_PREFIX_CACHE_HITS_TOKENS = "external_prefix_cache_hits_tokens"
    MM_CACHE_QUERIES = "mm_cache_queries"
    MM_CACHE_HITS = "mm_cache_hits"
    SPEC_DECODE_DRAFTS = "spec_decode_drafts"
    SPEC_DECODE_DRAFT_TOKENS = "spec_decode_draft_tokens"
    SPEC_DECODE_ACCEPTED_TOKENS = "spec_decode_accepted_tokens"
    SPEC_DECODE_ACCEPTED_TOKENS_BY_POSITION = "spec_decode_accepted_tokens_by_position"
    SPEC_DECODE_EMITTED_TOKENS = "spec_decode_emitted_tokens"
    SPEC_DECODE_ACCEPTANCE_RATIO = "spec_decode_acceptance_ratio"
    SPEC_DECODE_EFFICIENCY_RATIO = "spec_decode_efficiency_ratio"
    KV_OFFLOAD_BYTES = "kv_offload_bytes"
    KV_OFFLOAD_TIME_S = "kv_offload_time_s"
    KV_OFFLOAD_SIZE_BYTES = "kv_offload_size_bytes"
    KV_OFFLOAD_CPU_CACHE_USAGE_RATIO = "kv_offload_cpu_cache_usage_ratio"
    ESTIMATED_FLOPS_PER_GPU = "estimated_flops_per_gpu"
    ESTIMATED_READ_BYTES_PER_GPU = "estimated_read_bytes_per_gpu"
    ESTIMATED_WRITE_BYTES_PER_GPU = "estimated_write_bytes_per_gpu"
    ENGINE_SLEEP_STATE = "engine_sleep_state"
    LORA_REQUESTS_INFO = "lora_requests_info"
    KV_BLOCK_LIFETIME_S = "kv_block_lifetime_s"
    KV_BLOCK_IDLE_BEFORE_EVICT_S = "kv_block_idle_before_evict_s"
    KV_BLOCK_REUSE_GAP_S = "kv_block_reuse_gap_s"
    CORRUPTED_REQUESTS = "corrupted_requests"
    REQUEST_MAX_GENERATION_TOKENS = "request_max_generation_tokens"
    REQUEST_PARAMS_N = "request_params_n"
    REQUEST_PARAMS_MAX_TOKENS = "request_params_max_tokens"
    REQUEST_PREEMPTIONS = "request_preemptions"
    REQUESTS_KV_FETCH_BY_STAGE = "requests_kv_fetch_by_stage"
    # DCGM, one GPU each
    GPU_SM_CLOCK_HZ = "gpu_sm_clock_hz"
    GPU_MEMORY_CLOCK_HZ = "gpu_memory_clock_hz"
    GPU_TEMPERATURE_C = "gpu_temperature_c"
    GPU_MEMORY_TEMPERATURE_C = "gpu_memory_temperature_c"
    GPU_POWER_W = "gpu_power_w"
    GPU_ENERGY_J = "gpu_energy_j"
    GPU_UTIL_RATIO = "gpu_util_ratio"
    GPU_MEMORY_COPY_UTIL_RATIO = "gpu_memory_copy_util_ratio"
    GPU_ENCODER_UTIL_RATIO = "gpu_encoder_util_ratio"
    GPU_DECODER_UTIL_RATIO = "gpu_decoder_util_ratio"
    GPU_FB_FREE_BYTES = "gpu_fb_free_bytes"
    GPU_FB_USED_BYTES = "gpu_fb_used_bytes"
    GPU_FB_RESERVED_BYTES = "gpu_fb_reserved_bytes"
    GPU_FB_TOTAL_BYTES = "gpu_fb_total_bytes"
    GPU_PCIE_REPLAYS = "gpu_pcie_replays"
    GPU_PCIE_TX_BYTES_PER_S = "gpu_pcie_tx_bytes_per_s"
    GPU_PCIE_RX_BYTES_PER_S = "gpu_pcie_rx_bytes_per_s"
    GPU_NVLINK_BYTES_PER_S = "gpu_nvlink_bytes_per_s"
    GPU_LAST_XID = "gpu_last_xid"
    GPU_REMAPPED_ROWS_UNCORRECTABLE = "gpu_remapped_rows_uncorrectable"
    GPU_REMAPPED_ROWS_CORRECTABLE = "gpu_remapped_rows_correctable"
    GPU_ROW_REMAP_FAILED = "gpu_row_remap_failed"
    GPU_GRAPHICS_ACTIVE_RATIO = "gpu_graphics_active_ratio"
    GPU_SM_ACTIVE_RATIO = "gpu_sm_active_ratio"
    GPU_SM_OCCUPANCY_RATIO = "gpu_sm_occupancy_ratio"
    GPU_TENSOR_ACTIVE_RATIO = "gpu_tensor_active_ratio"
    GPU_DRAM_ACTIVE_RATIO = "gpu_dram_active_ratio"
    GPU_FP64_ACTIVE_RATIO = "gpu_fp64_active_ratio"
    GPU_FP32_ACTIVE_RATIO = "gpu_fp32_active_ratio"
    GPU_FP16_ACTIVE_RATIO = "gpu_fp16_active_ratio"
    GPU_VGPU_LICENSE_STATUS = "gpu_vgpu_license_status"
    GPU_XID_EVENTS = "gpu_xid_events"  # XIDs seen in the exporter's window, by `xid`
    GPU_HEALTH_STATUS = "gpu_health_status"  # DCGM health watch: 0 pass, 10 warn, 20 fail
    GPU_CLOCK_EVENTS = "gpu_clock_events"  # samples with a throttle reason, by `clock_event`
    GPU_P2P_STATUS = "gpu_p2p_status"
    # An inference gateway's endpoint picker, one pool each
    GATEWAY_REQUESTS = "gateway_requests"
    GATEWAY_REQUEST_ERRORS = "gateway_request_errors"  # by `error_code`
    POOL_KV_CACHE_USAGE_RATIO = "pool_kv_cache_usage_ratio"
    POOL_REQUESTS_WAITING_MEAN = "pool_requests_waiting_mean"
    POOL_READY_REPLICAS = "pool_ready_replicas"


# `error_code`s of `GATEWAY_REQUEST_ERRORS` that mean the gateway refused a request for want of
# capacity (shed by admission or flow control, a saturated pool, no ready endpoint), not for
# what the request was. `InferencePoolResourceExhausted` and `ServiceUnavailable` are the
# endpoint picker's (pkg/epp/util/error); plain `ResourceExhausted` is how flow-control shedding
# is spelt in some builds (not confirmed in the error util) and is read the same way.
GATEWAY_REJECTION_CODES: tuple[str, ...] = (
    "InferencePoolResourceExhausted",
    "ResourceExhausted",
    "ServiceUnavailable",
)


@dataclass(frozen=True)
class SignalSpec:
    unit: Unit
    kind: MetricType
    aggregation: Aggregation
    description: str


_C, _G, _H, _I = MetricType.COUNTER, MetricType.GAUGE, MetricType.HISTOGRAM, MetricType.INFO
_SUM, _MEAN, _MAX = Aggregation.SUM, Aggregation.MEAN, Aggregation.MAX

# One row per signal: unit, type, how a replica's series combine, what it means.
_SIGNAL_ROWS: tuple[tuple[Signal, Unit, MetricType, Aggregation, str], ...] = (
    (Signal.REQUESTS_RUNNING, Unit.REQUESTS, _G, _SUM, "requests in the running batch"),
    (Signal.REQUESTS_WAITING, Unit.REQUESTS, _G, _SUM, "requests queued, incl. deferred"),
    (Signal.REQUESTS_WAITING_BY_REASON, Unit.REQUESTS, _G, _SUM, "waiting, split by reason"),
    # Usage is a fraction of one engine's blocks; engines are alike, so the mean is the fleet
    # reading (REFERENCE: mean or max for usage gauges).
    (Signal.KV_CACHE_USAGE_RATIO, Unit.RATIO, _G, _MEAN, "fraction of KV blocks in use"),
    (Signal.PREFIX_CACHE_QUERIES_TOKENS, Unit.TOKENS, _C, _SUM, "prefix-cache lookups"),
    (Signal.PREFIX_CACHE_HITS_TOKENS, Unit.TOKENS, _C, _SUM, "prefix-cache hits"),
    (Signal.PROMPT_TOKENS, Unit.TOKENS, _C, _SUM, "prompt tokens, cached ones included"),
    (Signal.PROMPT_TOKENS_BY_SOURCE, Unit.TOKENS, _C, _SUM, "prompt tokens by source"),
    (Signal.GENERATION_TOKENS, Unit.TOKENS, _C, _SUM, "generated tokens"),
    (Signal.PREEMPTIONS, Unit.EVENTS, _C, _SUM, "scheduler preemptions"),
    (Signal.REQUESTS_FINISHED, Unit.REQUESTS, _C, _SUM, "finished requests by reason"),
    (Signal.ADMISSION_REJECTIONS, Unit.REQUESTS, _C, _SUM, "requests refused by reason"),
    (Signal.TTFT_S, Unit.SECONDS, _H, _SUM, "arrival to first token"),
    (Signal.INTER_TOKEN_LATENCY_S, Unit.SECONDS, _H, _SUM, "per decode iteration"),
    (Signal.REQUEST_TPOT_S, Unit.SECONDS, _H, _SUM, "decode time / (tokens - 1)"),
    (Signal.E2E_LATENCY_S, Unit.SECONDS, _H, _SUM, "arrival to last token"),
    (Signal.QUEUE_TIME_S, Unit.SECONDS, _H, _SUM, "time waiting"),
    (Signal.PREFILL_TIME_S, Unit.SECONDS, _H, _SUM, "time in prefill"),
    (Signal.DECODE_TIME_S, Unit.SECONDS, _H, _SUM, "time in decode"),
    (Signal.INFERENCE_TIME_S, Unit.SECONDS, _H, _SUM, "prefill + decode"),
    (Signal.REQUEST_PROMPT_TOKENS, Unit.TOKENS, _H, _SUM, "prompt length"),
    (Signal.REQUEST_GENERATION_TOKENS, Unit.TOKENS, _H, _SUM, "output length"),
    (Signal.REQUEST_PREFILL_KV_COMPUTED_TOKENS, Unit.TOKENS, _H, _SUM, "prefill not cached"),
    (Signal.ITERATION_TOKENS, Unit.TOKENS, _H, _SUM, "tokens per engine step"),
    (Signal.CACHE_CONFIG_INFO, Unit.INFO, _I, Aggregation.NONE, "KV-cache configuration"),
    (Signal.PREFIX_CACHE_HIT_RATIO, Unit.RATIO, _G, _MEAN, "prefix-cache hit rate, as reported"),
    (Signal.CPU_PREFIX_CACHE_HIT_RATIO, Unit.RATIO, _G, _MEAN, "CPU prefix-cache hit rate (V0)"),
    (Signal.CPU_KV_CACHE_USAGE_RATIO, Unit.RATIO, _G, _MEAN, "CPU swap space in use (V0)"),
    (Signal.REQUESTS_SWAPPED, Unit.REQUESTS, _G, _SUM, "requests swapped to CPU (V0)"),
    (Signal.PROMPT_THROUGHPUT_TOKENS_PER_S, Unit.TOKENS_PER_SECOND, _G, _SUM, "prefill rate"),
    (Signal.GENERATION_THROUGHPUT_TOKENS_PER_S, Unit.TOKENS_PER_SECOND, _G, _SUM, "decode rate"),
    (Signal.PROMPT_TOKENS_CACHED, Unit.TOKENS, _C, _SUM, "prompt tokens from a cache"),
    (Signal.PROMPT_TOKENS_CACHED_BY_SOURCE, Unit.TOKENS, _C, _SUM, "cached tokens by tier"),
    (Signal.PROMPT_TOKENS_RECOMPUTED, Unit.TOKENS, _C, _SUM, "cached tokens computed again"),
    (Signal.EXTERNAL_PREFIX_CACHE_QUERIES_TOKENS, Unit.TOKENS, _C, _SUM, "KV-connector lookups"),
    (Signal.EXTERNAL_PREFIX_CACHE_HITS_TOKENS, Unit.TOKENS, _C, _SUM, "KV-connector hits"),
    (Signal.MM_CACHE_QUERIES, Unit.ITEMS, _C, _SUM, "multi-modal cache lookups"),
    (Signal.MM_CACHE_HITS, Unit.ITEMS, _C, _SUM, "multi-modal cache hits"),
    (Signal.SPEC_DECODE_DRAFTS, Unit.EVENTS, _C, _SUM, "speculative drafts"),
    (Signal.SPEC_DECODE_DRAFT_TOKENS, Unit.TOKENS, _C, _SUM, "draft tokens proposed"),
    (Signal.SPEC_DECODE_ACCEPTED_TOKENS, Unit.TOKENS, _C, _SUM, "draft tokens accepted"),
    (Signal.SPEC_DECODE_ACCEPTED_TOKENS_BY_POSITION, Unit.TOKENS, _C, _SUM, "accepted, by pos"),
    (Signal.SPEC_DECODE_EMITTED_TOKENS, Unit.TOKENS, _C, _SUM, "tokens emitted (V0)"),
    (Signal.SPEC_DECODE_ACCEPTANCE_RATIO, Unit.RATIO, _G, _MEAN, "accepted / drafted, reported"),
    (Signal.SPEC_DECODE_EFFICIENCY_RATIO, Unit.RATIO, _G, _MEAN, "emitted / possible (V0)"),
    (Signal.KV_OFFLOAD_BYTES, Unit.BYTES, _C, _SUM, "KV bytes moved by transfer_type"),
    (Signal.KV_OFFLOAD_TIME_S, Unit.SECONDS, _C, _SUM, "time in KV transfers"),
    (Signal.KV_OFFLOAD_SIZE_BYTES, Unit.BYTES, _H, _SUM, "size of one KV transfer"),
    (Signal.KV_OFFLOAD_CPU_CACHE_USAGE_RATIO, Unit.RATIO, _G, _MEAN, "offload pool in use"),
    (Signal.ESTIMATED_FLOPS_PER_GPU, Unit.FLOPS, _C, _SUM, "estimated FLOPs (MFU)"),
    (Signal.ESTIMATED_READ_BYTES_PER_GPU, Unit.BYTES, _C, _SUM, "estimated bytes read (MFU)"),
    (Signal.ESTIMATED_WRITE_BYTES_PER_GPU, Unit.BYTES, _C, _SUM, "estimated bytes written"),
    (Signal.ENGINE_SLEEP_STATE, Unit.FLAG, _G, _MAX, "sleep state by sleep_state"),
    # The value is when the adapter sets last changed; the labels name them (comma-joined).
    (Signal.LORA_REQUESTS_INFO, Unit.UNIX_TIME, _G, Aggregation.NONE, "running/waiting adapters"),
    (Signal.KV_BLOCK_LIFETIME_S, Unit.SECONDS, _H, _SUM, "KV block allocation to eviction"),
    (Signal.KV_BLOCK_IDLE_BEFORE_EVICT_S, Unit.SECONDS, _H, _SUM, "KV block idle before eviction"),
    (Signal.KV_BLOCK_REUSE_GAP_S, Unit.SECONDS, _H, _SUM, "gap between KV block accesses"),
    (Signal.CORRUPTED_REQUESTS, Unit.REQUESTS, _C, _SUM, "requests with NaN logits"),
    (Signal.REQUEST_MAX_GENERATION_TOKENS, Unit.TOKENS, _H, _SUM, "requested output length"),
    (Signal.REQUEST_PARAMS_N, Unit.REQUESTS, _H, _SUM, "the n parameter"),
    (Signal.REQUEST_PARAMS_MAX_TOKENS, Unit.TOKENS, _H, _SUM, "the max_tokens parameter"),
    (Signal.REQUEST_PREEMPTIONS, Unit.EVENTS, _H, _SUM, "preemptions per request"),
    (Signal.REQUESTS_KV_FETCH_BY_STAGE, Unit.REQUESTS, _G, _SUM, "waiting on a KV load, by stage"),
    (Signal.GPU_SM_CLOCK_HZ, Unit.HERTZ, _G, _MEAN, "SM clock"),
    (Signal.GPU_MEMORY_CLOCK_HZ, Unit.HERTZ, _G, _MEAN, "memory clock"),
    (Signal.GPU_TEMPERATURE_C, Unit.CELSIUS, _G, _MAX, "GPU temperature"),
    (Signal.GPU_MEMORY_TEMPERATURE_C, Unit.CELSIUS, _G, _MAX, "memory temperature"),
    (Signal.GPU_POWER_W, Unit.WATTS, _G, _SUM, "board power draw"),
    (Signal.GPU_ENERGY_J, Unit.JOULES, _C, _SUM, "energy since driver load"),
    (Signal.GPU_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "a kernel ran (not a load signal)"),
    (Signal.GPU_MEMORY_COPY_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "memory interface busy"),
    (Signal.GPU_ENCODER_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "video encoder busy"),
    (Signal.GPU_DECODER_UTIL_RATIO, Unit.RATIO, _G, _MEAN, "video decoder busy"),
    (Signal.GPU_FB_FREE_BYTES, Unit.BYTES, _G, _SUM, "framebuffer free"),
    (Signal.GPU_FB_USED_BYTES, Unit.BYTES, _G, _SUM, "framebuffer used (fit, not load)"),
    (Signal.GPU_FB_RESERVED_BYTES, Unit.BYTES, _G, _SUM, "framebuffer reserved"),
    (Signal.GPU_FB_TOTAL_BYTES, Unit.BYTES, _G, _SUM, "framebuffer capacity"),
    (Signal.GPU_PCIE_REPLAYS, Unit.EVENTS, _C, _SUM, "PCIe retries"),
    (Signal.GPU_PCIE_TX_BYTES_PER_S, Unit.BYTES_PER_SECOND, _G, _SUM, "PCIe transmit rate"),
    (Signal.GPU_PCIE_RX_BYTES_PER_S, Unit.BYTES_PER_SECOND, _G, _SUM, "PCIe receive rate"),
    (Signal.GPU_NVLINK_BYTES_PER_S, Unit.BYTES_PER_SECOND, _G, _SUM, "NVLink, all links"),
    # The last XID seen, not a count; the max over a replica's GPUs flags any drainable one.
    (Signal.GPU_LAST_XID, Unit.CODE, _G, _MAX, "value of the last XID error"),
    (Signal.GPU_REMAPPED_ROWS_UNCORRECTABLE, Unit.EVENTS, _C, _SUM, "rows remapped, fatal"),
    (Signal.GPU_REMAPPED_ROWS_CORRECTABLE, Unit.EVENTS, _C, _SUM, "rows remapped, corrected"),
    (Signal.GPU_ROW_REMAP_FAILED, Unit.FLAG, _G, _MAX, "row remapping failed"),
    (Signal.GPU_GRAPHICS_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "graphics/compute engine busy"),
    (Signal.GPU_SM_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "SMs with a warp resident"),
    (Signal.GPU_SM_OCCUPANCY_RATIO, Unit.RATIO, _G, _MEAN, "warps resident / maximum"),
    (Signal.GPU_TENSOR_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "tensor pipe busy"),
    (Signal.GPU_DRAM_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "device memory interface busy"),
    (Signal.GPU_FP64_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "FP64 pipe busy"),
    (Signal.GPU_FP32_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "FP32 pipe busy"),
    (Signal.GPU_FP16_ACTIVE_RATIO, Unit.RATIO, _G, _MEAN, "FP16 pipe busy"),
    (Signal.GPU_VGPU_LICENSE_STATUS, Unit.CODE, _G, _MAX, "vGPU licence state"),
    # A count over the exporter's window (`window_size_in_ms`), not since boot: a gauge.
    (Signal.GPU_XID_EVENTS, Unit.EVENTS, _G, _SUM, "XIDs in the exporter's window, by xid"),
    (Signal.GPU_HEALTH_STATUS, Unit.CODE, _G, _MAX, "DCGM health: 0 pass, 10 warn, 20 fail"),
    (Signal.GPU_CLOCK_EVENTS, Unit.EVENTS, _G, _SUM, "throttled samples in the window"),
    (Signal.GPU_P2P_STATUS, Unit.CODE, _G, _MAX, "peer-to-peer link status"),
    # Every request that reached the gateway, admitted or not; the errors are a subset of them.
    (Signal.GATEWAY_REQUESTS, Unit.REQUESTS, _C, _SUM, "requests the gateway received"),
    (Signal.GATEWAY_REQUEST_ERRORS, Unit.REQUESTS, _C, _SUM, "gateway errors by error_code"),
    # The picker's own averages over its pool's replicas: already one reading per pool.
    (Signal.POOL_KV_CACHE_USAGE_RATIO, Unit.RATIO, _G, _MEAN, "pool's mean KV-cache usage"),
    (Signal.POOL_REQUESTS_WAITING_MEAN, Unit.REQUESTS, _G, _MEAN, "pool's mean queue per replica"),
    (Signal.POOL_READY_REPLICAS, Unit.REPLICAS, _G, _MAX, "ready replicas in the pool"),
)

SIGNALS: Mapping[Signal, SignalSpec] = {
    signal: SignalSpec(unit=unit, kind=kind, aggregation=aggregation, description=description)
    for signal, unit, kind, aggregation, description in _SIGNAL_ROWS
}


def signal_table() -> pl.LazyFrame:
    """`SIGNALS` as a frame: signal, unit, kind, aggregation (for joins in transforms)."""
    return pl.LazyFrame(
        {
            "signal": [s.value for s in SIGNALS],
            "unit": [spec.unit.value for spec in SIGNALS.values()],
            "kind": [spec.kind.value for spec in SIGNALS.values()],
            "aggregation": [spec.aggregation.value for spec in SIGNALS.values()],
        }
    )
