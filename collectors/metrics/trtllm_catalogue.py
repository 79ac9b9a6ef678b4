"""The TensorRT-LLM catalogue: trtllm-serve's families, also behind NVIDIA Dynamo, as signals.

What it rests on (TensorRT-LLM's tensorrt_llm/metrics/collector.py, Dynamo's re-export;
docs/catalogues.md):
- trtllm-serve names its families `trtllm_`; the first collector had no prefix, and Dynamo
  re-exported that one as `trtllm:` before moving to `trtllm_`; all three are read (a page
  without a prefix only when its target says it is TensorRT-LLM), the canonical name says
  `trtllm_`;
- labels `model_name` and `engine_type`; prometheus_client in one process, so counters come
  with `_created` samples, which are counted and never stored;
- `time_per_output_token_seconds` is observed once per request (the request's TPOT), not per
  token: TensorRT-LLM has no inter-token latency histogram;
- `prompt_cached_tokens` are prefix-cache hits in tokens; `kv_cache_hit_rate` is the engine's
  own ratio; `kv_cache_utilization` is used / max KV blocks, 0-1.
"""

from __future__ import annotations

from servewatch.collectors.metrics.catalogue import SourceRule
from servewatch.collectors.metrics.engine_family import EngineFamily, family_catalogue
from servewatch.pipeline.signals import Signal, Source

PREFIXES: tuple[str, ...] = ("trtllm_", "trtllm:", "")

_F = EngineFamily
TRTLLM_FAMILIES: tuple[EngineFamily, ...] = (
    _F("num_requests_running", Signal.REQUESTS_RUNNING),
    _F("num_requests_waiting", Signal.REQUESTS_WAITING),
    _F("kv_cache_utilization", Signal.KV_CACHE_USAGE_RATIO),
    _F("kv_cache_hit_rate", Signal.PREFIX_CACHE_HIT_RATIO),
    _F("prompt_tokens", Signal.PROMPT_TOKENS),
    _F("generation_tokens", Signal.GENERATION_TOKENS),
    _F("prompt_cached_tokens", Signal.PREFIX_CACHE_HITS_TOKENS),
    _F("request_success", Signal.REQUESTS_FINISHED),
    _F("spec_decode_num_draft_tokens", Signal.SPEC_DECODE_DRAFT_TOKENS),
    _F("spec_decode_num_accepted_tokens", Signal.SPEC_DECODE_ACCEPTED_TOKENS),
    _F("time_to_first_token_seconds", Signal.TTFT_S),
    _F("time_per_output_token_seconds", Signal.REQUEST_TPOT_S),
    _F("e2e_request_latency_seconds", Signal.E2E_LATENCY_S),
    _F("request_queue_time_seconds", Signal.QUEUE_TIME_S),
    _F("request_prefill_time_seconds", Signal.PREFILL_TIME_S),
    _F("request_decode_time_seconds", Signal.DECODE_TIME_S),
    _F("request_inference_time_seconds", Signal.INFERENCE_TIME_S),
)

TRTLLM_CATALOGUE = family_catalogue(
    "trtllm",
    TRTLLM_FAMILIES,
    prefixes=PREFIXES,
    source_rule=SourceRule(default=Source.TRTLLM_ENGINE),
)
