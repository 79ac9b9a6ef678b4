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
    DCGM = "dcgm"


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
