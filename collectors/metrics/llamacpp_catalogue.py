"""The llama.cpp catalogue: llama.cpp server's `llamacpp:` families (with `--metrics`) as signals.

What it rests on (llama.cpp's tools/server, earlier examples/server; docs/catalogues.md):
- the page is printed by hand: no labels, counters named with `_total` already and printed
  as they are, values with six significant digits (counters above a million lose precision);
- running and deferred requests are the slots processing and the tasks deferred;
- `prompt_tokens_total` leaves out tokens reused from the cache (vLLM's prompt tokens
  include them); `prompt_tokens_cached_total` is in the newest layout only;
- 2024 builds had `kv_cache_usage_ratio`; the 2025 KV-cache refactor removed it;
- there are no latency histograms: TTFT, ITL and the rest come from traces or not at all.
"""

from __future__ import annotations

from servewatch.collectors.metrics.catalogue import SourceRule
from servewatch.collectors.metrics.engine_family import (
    SAMPLE_SUFFIXES,
    EngineFamily,
    family_catalogue,
)
from servewatch.pipeline.signals import MetricType, Signal, Source

PREFIXES: tuple[str, ...] = ("llamacpp:", "llamacpp_")

_F = EngineFamily
LLAMACPP_FAMILIES: tuple[EngineFamily, ...] = (
    _F("requests_processing", Signal.REQUESTS_RUNNING),
    _F("requests_deferred", Signal.REQUESTS_WAITING),
    _F("kv_cache_usage_ratio", Signal.KV_CACHE_USAGE_RATIO),
    _F("prompt_tokens_total", Signal.PROMPT_TOKENS),
    _F("tokens_predicted_total", Signal.GENERATION_TOKENS),
    _F("prompt_tokens_cached_total", Signal.PREFIX_CACHE_HITS_TOKENS),
    _F("spec_decode_num_drafts_total", Signal.SPEC_DECODE_DRAFTS),
    _F("spec_decode_num_draft_tokens_total", Signal.SPEC_DECODE_DRAFT_TOKENS),
    _F("spec_decode_num_accepted_tokens_total", Signal.SPEC_DECODE_ACCEPTED_TOKENS),
    _F("prompt_tokens_seconds", Signal.PROMPT_THROUGHPUT_TOKENS_PER_S),
    _F("predicted_tokens_seconds", Signal.GENERATION_THROUGHPUT_TOKENS_PER_S),
)

LLAMACPP_CATALOGUE = family_catalogue(
    "llamacpp",
    LLAMACPP_FAMILIES,
    prefixes=PREFIXES,
    source_rule=SourceRule(default=Source.LLAMACPP_SERVER),
    # the family names carry `_total` already: nothing is appended, and nothing else read
    suffixes={**SAMPLE_SUFFIXES, MetricType.COUNTER: ("",)},
)
