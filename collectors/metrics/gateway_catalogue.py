"""The inference-gateway catalogue: the endpoint picker (EPP) of the Kubernetes Gateway API
Inference Extension, which llm-d runs in front of its vLLM pools, as signals.

What it rests on (kubernetes-sigs/gateway-api-inference-extension, pkg/epp/metrics/metrics.go
and pkg/epp/util/error/error.go; docs/catalogues.md):
- client_golang counters whose names end in `_total` already, with labels `model_name` and
  `target_model_name`; the error counter adds `error_code`, one of the error util's codes
  (`Unknown`, `BadRequest`, `Internal`, `ServiceUnavailable`, `ModelServerError`,
  `BadConfiguration`, `InferencePoolResourceExhausted`);
- the request counters were `inference_model_*` while the API's resource was InferenceModel
  and are `inference_objective_*` since it became InferenceObjective: both are read, the newer
  wins on a page that has both;
- the pool gauges (`inference_pool_*{name}`) are the picker's own averages over the pool's
  ready pods, one reading per pool: never summed with the replicas' own gauges.
"""

from __future__ import annotations

from servewatch.collectors.metrics.catalogue import SourceRule
from servewatch.collectors.metrics.engine_family import (
    SAMPLE_SUFFIXES,
    EngineFamily,
    family_catalogue,
)
from servewatch.pipeline.signals import GATEWAY_REJECTION_CODES, MetricType, Signal, Source

PREFIXES: tuple[str, ...] = ("inference_",)
# The prefixes that tell a gateway's page from its families (`page_kind`): `inference_` alone
# is too common a word to claim every family that starts with it.
KIND_PREFIXES: tuple[str, ...] = (
    "inference_objective_",
    "inference_model_",
    "inference_pool_",
    "inference_extension_",
)

# The error codes read as rejections are the signal's (`signals.GATEWAY_REJECTION_CODES`).
REJECTION_CODES = GATEWAY_REJECTION_CODES

_F = EngineFamily
GATEWAY_FAMILIES: tuple[EngineFamily, ...] = (
    _F("objective_request_total", Signal.GATEWAY_REQUESTS, aliases=("model_request_total",)),
    _F(
        "objective_request_error_total",
        Signal.GATEWAY_REQUEST_ERRORS,
        aliases=("model_request_error_total",),
    ),
    _F("pool_average_kv_cache_utilization", Signal.POOL_KV_CACHE_USAGE_RATIO),
    _F("pool_average_queue_size", Signal.POOL_REQUESTS_WAITING_MEAN),
    _F("pool_ready_pods", Signal.POOL_READY_REPLICAS),
)

GATEWAY_CATALOGUE = family_catalogue(
    "gateway",
    GATEWAY_FAMILIES,
    prefixes=PREFIXES,
    source_rule=SourceRule(default=Source.INFERENCE_GATEWAY),
    # client_golang names its counters with `_total`: nothing is appended
    suffixes={**SAMPLE_SUFFIXES, MetricType.COUNTER: ("",)},
)
