"""vLLM request spans: the `llm_request` span's attributes mapped onto rows of `requests`.

vLLM emits one SERVER span per finished request, attributes in seconds and tokens. Where a
replica, host, zone, pool or tenant is found depends on the deployment (resource attributes
from OTEL_RESOURCE_ATTRIBUTES, or span attributes set by a gateway), so `SpanMapping` names
the keys to try, span attributes first, then resource attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

from collectors.otlp_json import STATUS_ERROR, AttrValue, Span
from pipeline.tables import REQUESTS_SCHEMA

EMULATED_ATTRIBUTE = "servewatch.emulated"

# The current GenAI conventions renamed the token counts; vLLM still sends the older names.
PROMPT_TOKENS_KEYS = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")
COMPLETION_TOKENS_KEYS = ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")
LATENCY_KEYS = {
    "ttft_s": "gen_ai.latency.time_to_first_token",
    "e2e_s": "gen_ai.latency.e2e",
    "queue_s": "gen_ai.latency.time_in_queue",
    "prefill_s": "gen_ai.latency.time_in_model_prefill",
    "decode_s": "gen_ai.latency.time_in_model_decode",
    "inference_s": "gen_ai.latency.time_in_model_inference",
}
REQUIRED_LATENCIES = ("ttft_s", "e2e_s")


class SpanMappingError(ValueError):
    """A span of the request kind lacks something a request row needs."""


@dataclass(frozen=True)
class SpanMapping:
    """Where each request dimension is found: keys tried in order, span then resource."""

    span_name: str = "llm_request"
    replica_keys: tuple[str, ...] = (
        "servewatch.replica",
        "service.instance.id",
        "k8s.pod.name",
        "host.name",
        "service.name",
    )
    host_keys: tuple[str, ...] = ("servewatch.host", "host.name", "k8s.node.name")
    zone_keys: tuple[str, ...] = ("servewatch.zone", "cloud.availability_zone")
    model_keys: tuple[str, ...] = ("gen_ai.response.model", "gen_ai.request.model")
    pool_keys: tuple[str, ...] = ("servewatch.pool",)
    tenant_keys: tuple[str, ...] = ("servewatch.tenant", "tenant.id", "gen_ai.user.id")

    @property
    def dimension_keys(self) -> tuple[tuple[str, ...], ...]:
        """Keys per dimension, in the order of DIMENSIONS."""
        return (
            self.replica_keys,
            self.host_keys,
            self.zone_keys,
            self.model_keys,
            self.pool_keys,
            self.tenant_keys,
        )

    def lookup(self, span: Span, keys: Sequence[str]) -> str | None:
        for source in (span.attributes, span.resource):
            found = _first(source, keys)
            if found is not None:
                return found
        return None


DIMENSIONS = ("replica", "host", "zone", "model", "pool", "tenant")


def _first(attrs: Mapping[str, AttrValue], keys: Sequence[str]) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return str(value)
    return None


def _number(attrs: Mapping[str, AttrValue], key: str) -> float | None:
    value = attrs.get(key)
    if value is None:
        return None
    if type(value) is float or (isinstance(value, int) and not isinstance(value, bool)):
        if value < 0:
            raise SpanMappingError(f"attribute {key} is negative: {value}")
        return float(value)
    raise SpanMappingError(f"attribute {key} must be a number, got {value!r}")


def _count(attrs: Mapping[str, AttrValue], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        if type(value) is int and value >= 0:
            return value
        if isinstance(value, float) and value.is_integer() and value >= 0:
            return int(value)
        raise SpanMappingError(f"attribute {key} must be a non-negative count, got {value!r}")
    return None


# Column order of the tuples RequestRows collects; must list REQUESTS_SCHEMA's columns.
_ROW_COLUMNS = (
    "trace_id",
    "span_id",
    "request_id",
    *DIMENSIONS,
    "ok",
    "error_type",
    "prompt_tokens",
    "completion_tokens",
    *LATENCY_KEYS,
    "max_tokens",
    "emulated",
    "source",
    "arrival_ts",
    "end_ts",
    "ingested_ts",
)
assert sorted(_ROW_COLUMNS) == sorted(REQUESTS_SCHEMA.names()), "request row layout drifted"


@dataclass
class RequestRows:
    """Accumulates request rows as tuples (cheap for millions of spans), framed at the end."""

    mapping: SpanMapping = field(default_factory=SpanMapping)
    rows: list[tuple[object, ...]] = field(default_factory=list)
    # Resource-level dimensions are the same for every span of one resource: look them up once.
    _resource_cache: dict[int, tuple[Mapping[str, AttrValue], tuple[object, ...]]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        self._span_level_keys = frozenset(k for keys in self.mapping.dimension_keys for k in keys)

    def __len__(self) -> int:
        return len(self.rows)

    def is_request(self, span: Span) -> bool:
        return span.name == self.mapping.span_name

    def _resource_dimensions(self, resource: Mapping[str, AttrValue]) -> tuple[object, ...]:
        cached = self._resource_cache.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1]
        dims = tuple(_first(resource, keys) for keys in self.mapping.dimension_keys)
        self._resource_cache[id(resource)] = (resource, dims)
        return dims

    def add(self, span: Span, *, source: str) -> None:
        """Append one request span; raises SpanMappingError (and adds nothing) if it is unusable."""
        attrs = span.attributes
        latencies = tuple(_number(attrs, key) for key in LATENCY_KEYS.values())
        if latencies[0] is None or latencies[1] is None:  # ttft_s, e2e_s
            missing = LATENCY_KEYS["ttft_s" if latencies[0] is None else "e2e_s"]
            raise SpanMappingError(f"missing attribute {missing}")
        prompt_tokens = _count(attrs, PROMPT_TOKENS_KEYS)
        completion_tokens = _count(attrs, COMPLETION_TOKENS_KEYS)
        if completion_tokens is None:
            raise SpanMappingError(f"missing attribute {COMPLETION_TOKENS_KEYS[0]}")
        if span.start_unix_ns == 0:
            raise SpanMappingError("span has no start time (startTimeUnixNano is 0 or absent)")
        if span.end_unix_ns < span.start_unix_ns:
            raise SpanMappingError("span ends before it starts")
        dims = self._resource_dimensions(span.resource)
        if not self._span_level_keys.isdisjoint(attrs):
            # A gateway may set dimensions on the span itself; they win over the resource's.
            dims = tuple(
                _first(attrs, keys) or dim
                for keys, dim in zip(self.mapping.dimension_keys, dims, strict=True)
            )
        error_type = attrs.get("error.type")
        request_id = attrs.get("gen_ai.request.id")
        self.rows.append(
            (
                span.trace_id,
                span.span_id,
                None if request_id is None else str(request_id),
                *dims,
                span.status_code != STATUS_ERROR and error_type is None,
                None if error_type is None else str(error_type),
                prompt_tokens,
                completion_tokens,
                *latencies,
                _count(attrs, ("gen_ai.request.max_tokens",)),
                bool(span.resource.get(EMULATED_ATTRIBUTE, False)),
                source,
                span.start_unix_ns,
                span.end_unix_ns,
                None,  # ingested_ts: stamped by the store
            )
        )

    def to_frame(self) -> pl.DataFrame:
        columns = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(_ROW_COLUMNS)
        data: dict[str, Sequence[object] | pl.Series] = dict(
            zip(_ROW_COLUMNS, columns, strict=True)
        )
        data["arrival_ts"] = _timestamps(data["arrival_ts"])
        data["end_ts"] = _timestamps(data["end_ts"])
        frame = pl.DataFrame(data, schema_overrides=REQUESTS_SCHEMA).select(REQUESTS_SCHEMA.names())
        # One export may carry the same span twice (retries); keep the first.
        return frame.unique(subset=["trace_id", "span_id"], keep="first", maintain_order=True)


def _timestamps(unix_ns: Sequence[object] | pl.Series) -> pl.Series:
    return pl.Series(unix_ns, dtype=pl.Int64).cast(pl.Datetime("ns")).dt.cast_time_unit("us")
