"""The TGI catalogue: Hugging Face Text Generation Inference's `tgi_` families as signals.

What it rests on (TGI's router/src/server.rs and backends/v3; docs/catalogues.md):
- the Rust `metrics-exporter-prometheus` prints counters under their own names, without
  `_total` (both spellings are read), and histograms as `_bucket`/`_sum`/`_count`;
- no label names the model: it comes from the target (`model`);
- TGI measures no time to first token, no KV-cache usage and no prefix cache; those signals
  stay empty for a TGI replica rather than be made up from batch-level timings;
- `request_mean_time_per_token_duration` is the request's inference time over its generated
  tokens: it includes prefill, so it reads above a decode-only TPOT by about TTFT / tokens.
"""

from __future__ import annotations

from servewatch.collectors.metrics.catalogue import SourceRule
from servewatch.collectors.metrics.engine_family import (
    BARE_COUNTER_SUFFIXES,
    EngineFamily,
    family_catalogue,
)
from servewatch.pipeline.signals import Signal, Source

PREFIXES: tuple[str, ...] = ("tgi_",)

_F = EngineFamily
TGI_FAMILIES: tuple[EngineFamily, ...] = (
    _F("batch_current_size", Signal.REQUESTS_RUNNING),
    _F("queue_size", Signal.REQUESTS_WAITING),
    _F("request_success", Signal.REQUESTS_FINISHED),
    _F("request_duration", Signal.E2E_LATENCY_S),
    _F("request_queue_duration", Signal.QUEUE_TIME_S),
    _F("request_inference_duration", Signal.INFERENCE_TIME_S),
    _F("request_mean_time_per_token_duration", Signal.REQUEST_TPOT_S),
    _F("request_input_length", Signal.REQUEST_PROMPT_TOKENS),
    _F("request_generated_tokens", Signal.REQUEST_GENERATION_TOKENS),
)

TGI_CATALOGUE = family_catalogue(
    "tgi",
    TGI_FAMILIES,
    prefixes=PREFIXES,
    source_rule=SourceRule(default=Source.TGI_SERVER),
    suffixes=BARE_COUNTER_SUFFIXES,
)
