"""The vLLM metric catalogue: vLLM's /metrics names, across versions, mapped onto signals.

What it rests on (../shared/REFERENCE.md section 1, vLLM 0.33.0; docs/catalogues.md):
- names start `vllm:`; some pipelines rewrite that to `vllm_`, so both are read, and the
  canonical metric name always says `vllm:`;
- renamed families keep their old spelling as an alias (`gpu_cache_usage_perc`,
  `gpu_prefix_cache_queries/hits`, `time_per_output_token_seconds`); vLLM 0.9-0.11 sends both
  spellings at once, and then the current one wins (the alias is counted as shadowed);
- counters are read from their `_total` samples, histograms from `_bucket`/`_sum`/`_count`;
  `_created` samples are counted and never stored;
- labels are kept as exposed (`engine`, `model_name`, `le`, `finished_reason`, `reason`,
  `source`, and all of `cache_config_info`'s); V0 servers simply have no `engine`;
- a production-stack router re-exports some `vllm:` names with a `server` label: those samples
  get source `vllm_router`, so they are never summed with the engines' own.
Values need no conversion: vLLM already speaks seconds, tokens and fractions
(`kv_cache_usage_perc` is a fraction 0-1 despite its name).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from servewatch.collectors.metrics.catalogue import SourceRule, catalogue_frame
from servewatch.collectors.metrics.engine_family import EngineFamily, family_catalogue
from servewatch.pipeline.signals import Signal, Source

CANONICAL_PREFIX = "vllm:"
PREFIXES: tuple[str, ...] = ("vllm:", "vllm_")
ROUTER_LABEL = "server"

_F = EngineFamily
# Releases are the first and last of vLLM's published releases that expose the family (V0's
# engine ended with 0.10.2; V1 became the default in 0.8.0); docs/catalogues.md has the table.
VLLM_FAMILIES: tuple[EngineFamily, ...] = (
    _F("num_requests_running", Signal.REQUESTS_RUNNING, since="0.5.0"),
    _F("num_requests_waiting", Signal.REQUESTS_WAITING, since="0.5.0"),
    _F("num_requests_waiting_by_reason", Signal.REQUESTS_WAITING_BY_REASON, since="0.20.0"),
    _F(
        "kv_cache_usage_perc",
        Signal.KV_CACHE_USAGE_RATIO,
        ("gpu_cache_usage_perc",),
        since="0.9.2",
    ),
    # Until 0.8.5 the old names counted blocks, not tokens (docs/catalogues.md, "Prefix-cache
    # units"); from 0.9.0 they count tokens, and 0.9.2 renamed them.
    _F(
        "prefix_cache_queries",
        Signal.PREFIX_CACHE_QUERIES_TOKENS,
        ("gpu_prefix_cache_queries",),
        since="0.9.2",
    ),
    _F(
        "prefix_cache_hits",
        Signal.PREFIX_CACHE_HITS_TOKENS,
        ("gpu_prefix_cache_hits",),
        since="0.9.2",
    ),
    _F("prompt_tokens", Signal.PROMPT_TOKENS, since="0.5.0"),
    _F("prompt_tokens_by_source", Signal.PROMPT_TOKENS_BY_SOURCE, since="0.16.0"),
    _F("prompt_tokens_cached", Signal.PROMPT_TOKENS_CACHED, since="0.16.0"),
    _F("prompt_tokens_cached_by_source", Signal.PROMPT_TOKENS_CACHED_BY_SOURCE, since="0.32.0"),
    _F("prompt_tokens_recomputed", Signal.PROMPT_TOKENS_RECOMPUTED, since="0.16.0", until="0.19.0"),
    _F("generation_tokens", Signal.GENERATION_TOKENS, since="0.5.0"),
    _F("num_preemptions", Signal.PREEMPTIONS, since="0.5.0"),
    _F("request_success", Signal.REQUESTS_FINISHED, since="0.5.0"),
    _F("admission_rejections", Signal.ADMISSION_REJECTIONS, since="0.32.0"),
    _F(
        "external_prefix_cache_queries",
        Signal.EXTERNAL_PREFIX_CACHE_QUERIES_TOKENS,
        since="0.11.1",
    ),
    _F("external_prefix_cache_hits", Signal.EXTERNAL_PREFIX_CACHE_HITS_TOKENS, since="0.11.1"),
    _F("mm_cache_queries", Signal.MM_CACHE_QUERIES, since="0.11.1"),
    _F("mm_cache_hits", Signal.MM_CACHE_HITS, since="0.11.1"),
    _F("corrupted_requests", Signal.CORRUPTED_REQUESTS, since="0.11.1"),
    _F("engine_sleep_state", Signal.ENGINE_SLEEP_STATE, since="0.11.1"),
    _F("lora_requests_info", Signal.LORA_REQUESTS_INFO, since="0.6.4"),
    _F("num_requests_kv_fetch_by_stage", Signal.REQUESTS_KV_FETCH_BY_STAGE, since="0.32.0"),
    # speculative decoding (acceptance rate = accepted / draft tokens, derived in `sli`)
    _F("spec_decode_num_drafts", Signal.SPEC_DECODE_DRAFTS, since="0.8.5"),
    _F("spec_decode_num_draft_tokens", Signal.SPEC_DECODE_DRAFT_TOKENS, since="0.5.5"),
    _F("spec_decode_num_accepted_tokens", Signal.SPEC_DECODE_ACCEPTED_TOKENS, since="0.5.5"),
    _F(
        "spec_decode_num_accepted_tokens_per_pos",
        Signal.SPEC_DECODE_ACCEPTED_TOKENS_BY_POSITION,
        since="0.8.5",
    ),
    # KV offloading through a connector (the CPU tier)
    _F("kv_offload_total_bytes", Signal.KV_OFFLOAD_BYTES, since="0.16.0"),
    _F("kv_offload_total_time", Signal.KV_OFFLOAD_TIME_S, since="0.16.0"),
    _F("kv_offload_size", Signal.KV_OFFLOAD_SIZE_BYTES, since="0.16.0"),
    _F(
        "kv_offload_cpu_cache_usage_perc",
        Signal.KV_OFFLOAD_CPU_CACHE_USAGE_RATIO,
        since="0.24.0",
    ),
    # model FLOPs utilisation inputs (zero unless the server runs with --enable-mfu-metrics)
    _F("estimated_flops_per_gpu", Signal.ESTIMATED_FLOPS_PER_GPU, since="0.17.0"),
    _F("estimated_read_bytes_per_gpu", Signal.ESTIMATED_READ_BYTES_PER_GPU, since="0.17.0"),
    _F("estimated_write_bytes_per_gpu", Signal.ESTIMATED_WRITE_BYTES_PER_GPU, since="0.17.0"),
    # latency histograms
    _F("time_to_first_token_seconds", Signal.TTFT_S, since="0.5.0"),
    _F(
        "inter_token_latency_seconds",
        Signal.INTER_TOKEN_LATENCY_S,
        ("time_per_output_token_seconds",),
        since="0.10.2",
    ),
    _F("request_time_per_output_token_seconds", Signal.REQUEST_TPOT_S, since="0.11.0"),
    _F("e2e_request_latency_seconds", Signal.E2E_LATENCY_S, since="0.5.0"),
    # V0 named queue time twice; `time_in_queue_requests` left with 0.9.1
    _F(
        "request_queue_time_seconds",
        Signal.QUEUE_TIME_S,
        ("time_in_queue_requests",),
        since="0.6.4",
    ),
    _F("request_prefill_time_seconds", Signal.PREFILL_TIME_S, since="0.6.4"),
    _F("request_decode_time_seconds", Signal.DECODE_TIME_S, since="0.6.4"),
    _F("request_inference_time_seconds", Signal.INFERENCE_TIME_S, since="0.6.4"),
    _F("kv_block_lifetime_seconds", Signal.KV_BLOCK_LIFETIME_S, since="0.12.0"),
    _F("kv_block_idle_before_evict_seconds", Signal.KV_BLOCK_IDLE_BEFORE_EVICT_S, since="0.12.0"),
    _F("kv_block_reuse_gap_seconds", Signal.KV_BLOCK_REUSE_GAP_S, since="0.12.0"),
    # length and parameter histograms
    _F("request_prompt_tokens", Signal.REQUEST_PROMPT_TOKENS, since="0.5.0"),
    _F("request_generation_tokens", Signal.REQUEST_GENERATION_TOKENS, since="0.5.0"),
    _F(
        "request_prefill_kv_computed_tokens",
        Signal.REQUEST_PREFILL_KV_COMPUTED_TOKENS,
        since="0.13.0",
    ),
    _F(
        "request_max_num_generation_tokens",
        Signal.REQUEST_MAX_GENERATION_TOKENS,
        since="0.6.4",
    ),
    _F("request_params_n", Signal.REQUEST_PARAMS_N, since="0.5.0"),
    _F("request_params_max_tokens", Signal.REQUEST_PARAMS_MAX_TOKENS, since="0.6.4"),
    _F("request_num_preemptions", Signal.REQUEST_PREEMPTIONS, since="0.30.0"),
    # The family name itself ends in _total: its samples are iteration_tokens_total_bucket etc.
    _F("iteration_tokens_total", Signal.ITERATION_TOKENS, since="0.6.4"),
    _F("cache_config_info", Signal.CACHE_CONFIG_INFO, since="0.5.5"),
    # V0's engine only
    _F("num_requests_swapped", Signal.REQUESTS_SWAPPED, since="0.5.0", until="0.9.0"),
    _F("cpu_cache_usage_perc", Signal.CPU_KV_CACHE_USAGE_RATIO, since="0.5.0", until="0.9.0"),
    _F("gpu_prefix_cache_hit_rate", Signal.PREFIX_CACHE_HIT_RATIO, since="0.5.5", until="0.9.0"),
    _F(
        "cpu_prefix_cache_hit_rate",
        Signal.CPU_PREFIX_CACHE_HIT_RATIO,
        since="0.5.5",
        until="0.9.0",
    ),
    _F(
        "avg_prompt_throughput_toks_per_s",
        Signal.PROMPT_THROUGHPUT_TOKENS_PER_S,
        since="0.5.0",
        until="0.6.6",
    ),
    _F(
        "avg_generation_throughput_toks_per_s",
        Signal.GENERATION_THROUGHPUT_TOKENS_PER_S,
        since="0.5.0",
        until="0.6.6",
    ),
    _F(
        "spec_decode_draft_acceptance_rate",
        Signal.SPEC_DECODE_ACCEPTANCE_RATIO,
        since="0.5.5",
        until="0.9.2",
    ),
    _F(
        "spec_decode_efficiency",
        Signal.SPEC_DECODE_EFFICIENCY_RATIO,
        since="0.5.5",
        until="0.9.2",
    ),
    _F(
        "spec_decode_num_emitted_tokens",
        Signal.SPEC_DECODE_EMITTED_TOKENS,
        since="0.5.5",
        until="0.9.2",
    ),
)

VLLM_CATALOGUE = family_catalogue(
    "vllm",
    VLLM_FAMILIES,
    prefixes=PREFIXES,
    source_rule=SourceRule(
        default=Source.VLLM_ENGINE, label=ROUTER_LABEL, labelled=Source.VLLM_ROUTER
    ),
)


def catalogue_vllm_frame(samples: pl.LazyFrame, *, page_by: Sequence[str] = ()) -> pl.LazyFrame:
    """Many vLLM pages catalogued at once (see `collectors.metrics.catalogue.catalogue_frame`)."""
    return catalogue_frame(samples, catalogue=VLLM_CATALOGUE, page_by=page_by)
