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

    def lookup(self, span: Span, keys: Sequence[str]) -> str | None:
        for source in (span.attributes, span.resource):
            for key in keys:
                value = source.get(key)
                if value is not None and value != "":
                    return str(value)
        return None


def _number(attrs: Mapping[str, AttrValue], key: str) -> float | None:
    value = attrs.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpanMappingError(f"attribute {key} must be a number, got {value!r}")
    return float(value)


def _count(attrs: Mapping[str, AttrValue], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise SpanMappingError(f"attribute {key} must be a non-negative count, got {value!r}")
        if isinstance(value, float) and not value.is_integer():
            raise SpanMappingError(f"attribute {key} must be a whole count, got {value!r}")
        return int(value)
    return None


@dataclass
class RequestRows:
    """Accumulates request rows column by column (cheap for millions of spans)."""

    mapping: SpanMapping = field(default_factory=SpanMapping)
    columns: dict[str, list[object]] = field(
        default_factory=lambda: {name: [] for name in REQUESTS_SCHEMA.names()}
    )
    arrival_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.arrival_ns)

    def is_request(self, span: Span) -> bool:
        return span.name == self.mapping.span_name

    def add(self, span: Span, *, source: str) -> None:
        """Append one request span; raises SpanMappingError (and adds nothing) if it is unusable."""
        attrs = span.attributes
        latencies = {column: _number(attrs, key) for column, key in LATENCY_KEYS.items()}
        for column in REQUIRED_LATENCIES:
            if latencies[column] is None:
                raise SpanMappingError(f"missing attribute {LATENCY_KEYS[column]}")
        for column, value in latencies.items():
            if value is not None and value < 0:
                raise SpanMappingError(f"attribute {LATENCY_KEYS[column]} is negative: {value}")
        prompt_tokens = _count(attrs, PROMPT_TOKENS_KEYS)
        completion_tokens = _count(attrs, COMPLETION_TOKENS_KEYS)
        if completion_tokens is None:
            raise SpanMappingError(f"missing attribute {COMPLETION_TOKENS_KEYS[0]}")
        if span.start_unix_ns == 0:
            raise SpanMappingError("span has no start time (startTimeUnixNano is 0 or absent)")
        if span.end_unix_ns < span.start_unix_ns:
            raise SpanMappingError("span ends before it starts")
        error_type = attrs.get("error.type")
        ok = span.status_code != STATUS_ERROR and error_type is None
        mapping = self.mapping
        row: dict[str, object] = {
            "trace_id": span.trace_id,
            "span_id": span.span_id,
            "request_id": _str_or_none(attrs.get("gen_ai.request.id")),
            "replica": mapping.lookup(span, mapping.replica_keys),
            "host": mapping.lookup(span, mapping.host_keys),
            "zone": mapping.lookup(span, mapping.zone_keys),
            "model": mapping.lookup(span, mapping.model_keys),
            "pool": mapping.lookup(span, mapping.pool_keys),
            "tenant": mapping.lookup(span, mapping.tenant_keys),
            "arrival_ts": None,
            "end_ts": None,
            "ok": ok,
            "error_type": None if error_type is None else str(error_type),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            **latencies,
            "max_tokens": _count(attrs, ("gen_ai.request.max_tokens",)),
            "emulated": bool(span.resource.get(EMULATED_ATTRIBUTE, False)),
            "source": source,
        }
        for name, cell in row.items():
            self.columns[name].append(cell)
        self.arrival_ns.append(span.start_unix_ns)
        self.end_ns.append(span.end_unix_ns)

    def to_frame(self) -> pl.DataFrame:
        data: dict[str, list[object] | pl.Series] = dict(self.columns)
        data["arrival_ts"] = _timestamps(self.arrival_ns)
        data["end_ts"] = _timestamps(self.end_ns)
        frame = pl.DataFrame(data, schema=REQUESTS_SCHEMA)
        # One export may carry the same span twice (retries); keep the first.
        return frame.unique(subset=["trace_id", "span_id"], keep="first", maintain_order=True)


def _str_or_none(value: AttrValue) -> str | None:
    return None if value is None else str(value)


def _timestamps(unix_ns: list[int]) -> pl.Series:
    return pl.Series(unix_ns, dtype=pl.Int64).cast(pl.Datetime("ns")).dt.cast_time_unit("us")
