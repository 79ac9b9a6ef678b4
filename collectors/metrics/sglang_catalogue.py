"""The SGLang metric catalogue: SGLang's `sglang:` families mapped onto the canonical signals.

What it rests on (SGLang's python/sglang/srt/metrics/collector.py; docs/catalogues.md):
- the scheduler's gauges carry `model_name`, `engine_type`, `tp_rank`, `pp_rank`,
  `moe_ep_rank` (and `dp_rank` under data parallelism); the tokenizer's counters and
  histograms carry `model_name`; labels are kept as exposed;
- SGLang runs prometheus_client in multiprocess mode: no `_created` samples, and the gauges
  left in its default mode carry a `pid` label;
- the first layout (2024) named the scheduler gauges `num_requests_running/waiting` and the
  length histograms `request_prompt/generation_tokens`; spring 2025 renamed the per-token
  latency `time_per_output_token_seconds` to `inter_token_latency_seconds`; the old names are
  read as aliases;
- SGLang counts no prefix-cache queries: `cached_tokens` are its hits, and `sli` takes prompt
  tokens as the lookups (every prompt token is looked up); `cache_hit_rate` is its own ratio.
Values need no conversion: seconds, tokens and ratios 0-1 (`token_usage` is the KV pool's).
"""

from __future__ import annotations

from servewatch.collectors.metrics.catalogue import SourceRule
from servewatch.collectors.metrics.engine_family import EngineFamily, family_catalogue
from servewatch.pipeline.signals import Signal, Source

PREFIXES: tuple[str, ...] = ("sglang:", "sglang_")

_F = EngineFamily
SGLANG_FAMILIES: tuple[EngineFamily, ...] = (
    _F("num_running_reqs", Signal.REQUESTS_RUNNING, ("num_requests_running",)),
    _F("num_queue_reqs", Signal.REQUESTS_WAITING, ("num_requests_waiting",)),
    _F("token_usage", Signal.KV_CACHE_USAGE_RATIO),
    _F("cache_hit_rate", Signal.PREFIX_CACHE_HIT_RATIO),
    _F("gen_throughput", Signal.GENERATION_THROUGHPUT_TOKENS_PER_S),
    _F("spec_accept_rate", Signal.SPEC_DECODE_ACCEPTANCE_RATIO),
    _F("prompt_tokens", Signal.PROMPT_TOKENS),
    _F("generation_tokens", Signal.GENERATION_TOKENS),
    _F("cached_tokens", Signal.PREFIX_CACHE_HITS_TOKENS),
    _F("num_requests", Signal.REQUESTS_FINISHED, ("request_success",)),
    _F("num_retracted_requests", Signal.PREEMPTIONS),
    _F("time_to_first_token_seconds", Signal.TTFT_S),
    _F(
        "inter_token_latency_seconds",
        Signal.INTER_TOKEN_LATENCY_S,
        ("time_per_output_token_seconds",),
    ),
    _F("e2e_request_latency_seconds", Signal.E2E_LATENCY_S),
    _F("queue_time_seconds", Signal.QUEUE_TIME_S),
    _F("prompt_tokens_histogram", Signal.REQUEST_PROMPT_TOKENS, ("request_prompt_tokens",)),
    _F(
        "generation_tokens_histogram",
        Signal.REQUEST_GENERATION_TOKENS,
        ("request_generation_tokens",),
    ),
)

SGLANG_CATALOGUE = family_catalogue(
    "sglang",
    SGLANG_FAMILIES,
    prefixes=PREFIXES,
    source_rule=SourceRule(default=Source.SGLANG_ENGINE),
)
