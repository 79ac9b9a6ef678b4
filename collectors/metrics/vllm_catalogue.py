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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from servewatch.collectors.metrics.catalogue import (
    Catalogue,
    CatalogueEntry,
    SourceRule,
    catalogue_frame,
)
from servewatch.pipeline.signals import SIGNALS, MetricType, Signal, Source

CANONICAL_PREFIX = "vllm:"
PREFIXES: tuple[str, ...] = ("vllm:", "vllm_")
ROUTER_LABEL = "server"


@dataclass(frozen=True)
class VllmFamily:
    """A metric family by its current name (no prefix, no sample suffix) and older names."""

    name: str
    signal: Signal
    aliases: tuple[str, ...] = ()


VLLM_FAMILIES: tuple[VllmFamily, ...] = (
    VllmFamily("num_requests_running", Signal.REQUESTS_RUNNING),
    VllmFamily("num_requests_waiting", Signal.REQUESTS_WAITING),
    VllmFamily("num_requests_waiting_by_reason", Signal.REQUESTS_WAITING_BY_REASON),
    VllmFamily("kv_cache_usage_perc", Signal.KV_CACHE_USAGE_RATIO, ("gpu_cache_usage_perc",)),
    VllmFamily(
        "prefix_cache_queries", Signal.PREFIX_CACHE_QUERIES_TOKENS, ("gpu_prefix_cache_queries",)
    ),
    VllmFamily("prefix_cache_hits", Signal.PREFIX_CACHE_HITS_TOKENS, ("gpu_prefix_cache_hits",)),
    VllmFamily("prompt_tokens", Signal.PROMPT_TOKENS),
    VllmFamily("prompt_tokens_by_source", Signal.PROMPT_TOKENS_BY_SOURCE),
    VllmFamily("generation_tokens", Signal.GENERATION_TOKENS),
    VllmFamily("num_preemptions", Signal.PREEMPTIONS),
    VllmFamily("request_success", Signal.REQUESTS_FINISHED),
    VllmFamily("admission_rejections", Signal.ADMISSION_REJECTIONS),
    VllmFamily("time_to_first_token_seconds", Signal.TTFT_S),
    VllmFamily(
        "inter_token_latency_seconds",
        Signal.INTER_TOKEN_LATENCY_S,
        ("time_per_output_token_seconds",),
    ),
    VllmFamily("request_time_per_output_token_seconds", Signal.REQUEST_TPOT_S),
    VllmFamily("e2e_request_latency_seconds", Signal.E2E_LATENCY_S),
    VllmFamily("request_queue_time_seconds", Signal.QUEUE_TIME_S),
    VllmFamily("request_prefill_time_seconds", Signal.PREFILL_TIME_S),
    VllmFamily("request_decode_time_seconds", Signal.DECODE_TIME_S),
    VllmFamily("request_inference_time_seconds", Signal.INFERENCE_TIME_S),
    VllmFamily("request_prompt_tokens", Signal.REQUEST_PROMPT_TOKENS),
    VllmFamily("request_generation_tokens", Signal.REQUEST_GENERATION_TOKENS),
    VllmFamily("request_prefill_kv_computed_tokens", Signal.REQUEST_PREFILL_KV_COMPUTED_TOKENS),
    # The family name itself ends in _total: its samples are iteration_tokens_total_bucket etc.
    VllmFamily("iteration_tokens_total", Signal.ITERATION_TOKENS),
    VllmFamily("cache_config_info", Signal.CACHE_CONFIG_INFO),
)

# The sample names a family of each type exposes, as suffixes of the family name.
SAMPLE_SUFFIXES: Mapping[MetricType, tuple[str, ...]] = {
    MetricType.COUNTER: ("_total",),
    MetricType.GAUGE: ("",),
    MetricType.INFO: ("",),
    MetricType.HISTOGRAM: ("_bucket", "_sum", "_count"),
}


def _entries() -> Iterator[CatalogueEntry]:
    for family in VLLM_FAMILIES:
        canonical = CANONICAL_PREFIX + family.name
        spellings = [(family.name, False), *((alias, True) for alias in family.aliases)]
        for spelling, alias in spellings:
            for prefix in PREFIXES:
                for suffix in SAMPLE_SUFFIXES[SIGNALS[family.signal].kind]:
                    yield CatalogueEntry(
                        exposed=prefix + spelling + suffix,
                        signal=family.signal,
                        metric=canonical + suffix,
                        family=canonical,
                        alias=alias,
                    )


VLLM_CATALOGUE = Catalogue(
    name="vllm",
    entries=tuple(_entries()),
    source_rule=SourceRule(
        default=Source.VLLM_ENGINE, label=ROUTER_LABEL, labelled=Source.VLLM_ROUTER
    ),
)


def catalogue_vllm_frame(samples: pl.LazyFrame, *, page_by: Sequence[str] = ()) -> pl.LazyFrame:
    """Many vLLM pages catalogued at once (see `collectors.metrics.catalogue.catalogue_frame`)."""
    return catalogue_frame(samples, catalogue=VLLM_CATALOGUE, page_by=page_by)
