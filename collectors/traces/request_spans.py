"""vLLM request spans: the `llm_request` span's attributes mapped onto rows of `requests`.

vLLM emits one SERVER span per finished request, attributes in seconds and tokens. Where a
replica, host, zone, pool, tenant or LoRA adapter is found depends on the deployment (resource
attributes from OTEL_RESOURCE_ATTRIBUTES, or span attributes set by a gateway), so `SpanMapping`
names the keys to try, span attributes first, then resource attributes. The replica and the
scrape target a resource's spans belong to are decided by `span_identity`; what the span and
its resource leave out (host, zone, pool, model) comes from that target's labels, and the model
last from the configured `default_model` (vLLM's V1 request spans name no model).

A request's adapter is the span's or resource's adapter attribute if one is set (vLLM sets
none), else its model when that differs from the base model (the matched target's model, else
`default_model`): a request for a LoRA adapter names the adapter as its model, so a span whose
`gen_ai.request.model` something in front of vLLM filled (a gateway, a Collector's attributes
processor) tells the adapter apart.

A span is refused (`SpanMappingError`, that span only) unless it makes a row the store and the
SLIs can hold: latencies finite and non-negative, TTFT not after the end (e2e), counts within
BIGINT, and times from 1970 to before 2^63 ns (2262, what a nanosecond timestamp holds), the
end not before the start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import polars as pl

from servewatch.collectors.traces.otlp_json import STATUS_ERROR, AttrValue, Span
from servewatch.collectors.traces.span_identity import (
    TargetDirectory,
    TargetLabels,
    resolve_replica,
)
from servewatch.pipeline.tables import REQUESTS_SCHEMA

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
# Span times are unix nanoseconds held in an Int64 (then microsecond TIMESTAMPs); counts BIGINT.
INT64_LIMIT = 1 << 63


class SpanMappingError(ValueError):
    """A span of the request kind lacks something a request row needs."""


@dataclass(frozen=True)
class SpanMapping:
    """Where each request dimension is found: keys tried in order, span then resource."""

    span_name: str = "llm_request"
    # Keys that name a replica outright. Not `service.instance.id` unless a deployment sets it
    # itself: the OpenTelemetry SDK fills it with a new random UUID in every process.
    replica_keys: tuple[str, ...] = ("servewatch.replica", "k8s.pod.name")
    host_keys: tuple[str, ...] = ("servewatch.host", "host.name", "k8s.node.name")
    # The engine process on its host: vLLM's own resource attribute, then the SDK's.
    process_keys: tuple[str, ...] = ("vllm.process_id", "process.pid")
    # Tried for the replica when a resource names neither a replica nor a host.
    fallback_replica_keys: tuple[str, ...] = ()
    # The namespace of a pod the replica keys named: a pod target's replica is
    # `<namespace>/<pod>`.
    namespace_keys: tuple[str, ...] = ("k8s.namespace.name",)
    # Several engine processes share each host and no target tells them apart: name each
    # replica by its host and process id.
    replica_per_process: bool = False
    zone_keys: tuple[str, ...] = ("servewatch.zone", "cloud.availability_zone")
    # What the request asked for (a LoRA request names its adapter), then what answered. vLLM's
    # V1 span sets neither; V0 set gen_ai.response.model to the model's path.
    model_keys: tuple[str, ...] = ("gen_ai.request.model", "gen_ai.response.model")
    pool_keys: tuple[str, ...] = ("servewatch.pool",)
    tenant_keys: tuple[str, ...] = ("servewatch.tenant", "tenant.id", "gen_ai.user.id")
    # The OpenTelemetry GenAI name, then the general session id a gateway may set instead.
    conversation_keys: tuple[str, ...] = ("gen_ai.conversation.id", "session.id")
    # A gateway's name for the LoRA adapter; vLLM's spans carry none (see the module text).
    adapter_keys: tuple[str, ...] = ("servewatch.adapter",)
    # The model of requests whose span, resource and target name none.
    default_model: str | None = None

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
            self.conversation_keys,
            self.adapter_keys,
        )


# The request's dimensions, and the conversation it belongs to, found the same way.
DIMENSIONS = (
    "replica",
    "host",
    "zone",
    "model",
    "pool",
    "tenant",
    "conversation_id",
    "adapter",
)
_REPLICA, _HOST, _ZONE, _MODEL, _POOL = range(5)
_ADAPTER = DIMENSIONS.index("adapter")


def _first(attrs: Mapping[str, AttrValue], keys: Sequence[str]) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return str(value)
    return None


def _adapter(named: str | None, model: str | None, base_model: str | None) -> str | None:
    """The adapter an attribute names, else the model when it is not the base model."""
    if named is not None:
        return named
    if base_model is not None and model is not None and model != base_model:
        return model
    return None


def _number(attrs: Mapping[str, AttrValue], key: str) -> float | None:
    value = attrs.get(key)
    if value is None:
        return None
    if type(value) is float or (isinstance(value, int) and not isinstance(value, bool)):
        if value < 0:
            raise SpanMappingError(f"attribute {key} is negative: {value}")
        try:
            seconds = float(value)
        except OverflowError:  # an integer past any float
            seconds = math.inf
        if not math.isfinite(seconds):
            raise SpanMappingError(f"attribute {key} must be a finite number, got {value}")
        return seconds
    raise SpanMappingError(f"attribute {key} must be a number, got {value!r}")


def _count(attrs: Mapping[str, AttrValue], keys: Sequence[str]) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        if type(value) is int or (isinstance(value, float) and value.is_integer()):
            if 0 <= value < INT64_LIMIT:
                return int(value)
            if value > 0:
                raise SpanMappingError(f"attribute {key} is too large for a count: {value!r}")
        raise SpanMappingError(f"attribute {key} must be a non-negative count, got {value!r}")
    return None


def _plain_floats(values: list[AttrValue]) -> bool:
    """All present, finite and non-negative floats: the common case, which needs no further
    checks."""
    try:
        # min() fails on None and on mixed types; a negative float fails the comparison. A sum
        # of non-negative floats is finite only if none is NaN or infinite.
        return (
            min(values) >= 0.0  # type: ignore[type-var, operator]
            and set(map(type, values)) == _FLOAT_ONLY
            and sum(values) < math.inf  # type: ignore[arg-type]
        )
    except TypeError:
        return False


_FLOAT_ONLY = {float}


# Column order of the tuples RequestRows collects; must list REQUESTS_SCHEMA's columns.
_ROW_COLUMNS = (
    "trace_id",
    "span_id",
    "request_id",
    *DIMENSIONS,
    "emulated",
    "ok",
    "error_type",
    "prompt_tokens",
    "completion_tokens",
    *LATENCY_KEYS,
    "max_tokens",
    "source",
    "arrival_ts",
    "end_ts",
    "ingested_ts",
)
assert sorted(_ROW_COLUMNS) == sorted(REQUESTS_SCHEMA.names()), "request row layout drifted"
_LATENCY_ATTRIBUTES = tuple(LATENCY_KEYS.values())
MAX_TOKENS_KEY = "gen_ai.request.max_tokens"
_MAX_TOKENS_KEYS = (MAX_TOKENS_KEY,)
REQUEST_ID_KEY = "gen_ai.request.id"
ERROR_TYPE_KEY = "error.type"


@dataclass(frozen=True, slots=True)
class ResourceDimensions:
    """What one resource gives each of its request spans: `row`, the dimensions (DIMENSIONS
    order) and the emulated flag; and what a span's own attributes are resolved against."""

    row: tuple[object, ...]
    target: TargetLabels | None
    base_model: str | None  # the model an adapter is told apart from
    adapter: str | None  # named by an attribute, not derived from the model


@dataclass
class RequestRows:
    """Accumulates request rows as tuples (cheap for millions of spans), framed at the end.
    `targets` are the engine scrape targets spans are matched to (see `span_identity`)."""

    mapping: SpanMapping = field(default_factory=SpanMapping)
    targets: TargetDirectory = field(default_factory=TargetDirectory)
    rows: list[tuple[object, ...]] = field(default_factory=list)
    # Resource-level dimensions are the same for every span of one resource: look them up once.
    _resource_cache: dict[int, tuple[Mapping[str, AttrValue], ResourceDimensions]] = field(
        default_factory=dict
    )

    _span_lookup_cache: dict[frozenset[str], tuple[tuple[int, tuple[str, ...]], ...]] = field(
        default_factory=dict
    )
    # Rows already framed column-wise (`add_frame`), in order before `rows`.
    _frames: list[pl.DataFrame] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._span_level_keys = frozenset(k for keys in self.mapping.dimension_keys for k in keys)
        self._dimension_lookups = tuple(
            (index, keys, frozenset(keys)) for index, keys in enumerate(self.mapping.dimension_keys)
        )

    def __len__(self) -> int:
        return sum(frame.height for frame in self._frames) + len(self.rows)

    def is_request(self, span: Span) -> bool:
        return span.name == self.mapping.span_name

    def attribute_kinds(self) -> dict[str, str]:
        """Every span attribute the mapping reads, with the OTLP AnyValue field it should hold
        (`string_value`, `int_value` or `double_value`); binary decoders read only these."""
        kinds = dict.fromkeys(self._span_level_keys, "string_value")
        kinds.update(dict.fromkeys(_LATENCY_ATTRIBUTES, "double_value"))
        counts = (*PROMPT_TOKENS_KEYS, *COMPLETION_TOKENS_KEYS, *_MAX_TOKENS_KEYS)
        kinds.update(dict.fromkeys(counts, "int_value"))
        kinds[REQUEST_ID_KEY] = kinds[ERROR_TYPE_KEY] = "string_value"
        return kinds

    def resource_dimensions(self, resource: Mapping[str, AttrValue]) -> ResourceDimensions:
        """The resource's dimensions and the target its spans match, for `add_request`."""
        cached = self._resource_cache.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1]
        mapping = self.mapping
        dims: list[object] = [_first(resource, keys) for keys in mapping.dimension_keys]
        named = dims[_REPLICA]
        host = dims[_HOST]
        if named is None and host is None:
            named = _first(resource, mapping.fallback_replica_keys)
        identity = resolve_replica(
            named=cast("str | None", named),
            namespace=_first(resource, mapping.namespace_keys) if named is not None else None,
            host=cast("str | None", host),
            process=_first(resource, mapping.process_keys),
            model=cast("str | None", dims[_MODEL]),
            per_process=mapping.replica_per_process,
            directory=self.targets,
        )
        dims[_REPLICA] = identity.replica
        target = identity.target
        adapter = cast("str | None", dims[_ADAPTER])
        base_model = mapping.default_model
        if target is not None:
            for index, label in (
                (_HOST, target.host),
                (_ZONE, target.zone),
                (_MODEL, target.model),
                (_POOL, target.pool),
            ):
                dims[index] = dims[index] or label
            base_model = target.model or base_model
        dims[_MODEL] = dims[_MODEL] or base_model
        dims[_ADAPTER] = _adapter(adapter, cast("str | None", dims[_MODEL]), base_model)
        found = ResourceDimensions(
            row=(*dims, bool(resource.get(EMULATED_ATTRIBUTE, False))),
            target=target,
            base_model=base_model,
            adapter=adapter,
        )
        self._resource_cache[id(resource)] = (resource, found)
        return found

    def add(self, span: Span, *, source: str) -> None:
        """Append one request span; raises SpanMappingError (and adds nothing) if it is unusable."""
        self.add_request(
            span.trace_id,
            span.span_id,
            start_ns=span.start_unix_ns,
            end_ns=span.end_unix_ns,
            status_code=span.status_code,
            attrs=span.attributes,
            resource_dimensions=self.resource_dimensions(span.resource),
            source=source,
        )

    def add_request(
        self,
        trace_id: str,
        span_id: str,
        *,
        start_ns: int,
        end_ns: int,
        status_code: int,
        attrs: Mapping[str, AttrValue],
        resource_dimensions: ResourceDimensions,
        source: str,
    ) -> None:
        """`add` of a request span given by its parts, `resource_dimensions` from
        `resource_dimensions(span.resource)`: binary decoders call it without building a Span."""
        get = attrs.get
        latencies = list(map(get, _LATENCY_ATTRIBUTES))
        if not _plain_floats(latencies):
            latencies = [_number(attrs, key) for key in _LATENCY_ATTRIBUTES]
        # Either path leaves floats or None.
        ttft, e2e = cast("float | None", latencies[0]), cast("float | None", latencies[1])
        if ttft is None or e2e is None:
            missing = LATENCY_KEYS["ttft_s" if ttft is None else "e2e_s"]
            raise SpanMappingError(f"missing attribute {missing}")
        if ttft > e2e:
            raise SpanMappingError(
                f"attribute {LATENCY_KEYS['ttft_s']} ({ttft}) exceeds {LATENCY_KEYS['e2e_s']} "
                f"({e2e}): the first token cannot come after the request ended"
            )
        # The legacy token names come first and are what vLLM sends: try them directly.
        prompt_tokens = get(PROMPT_TOKENS_KEYS[0])
        if type(prompt_tokens) is not int or not 0 <= prompt_tokens < INT64_LIMIT:
            prompt_tokens = _count(attrs, PROMPT_TOKENS_KEYS)
        completion_tokens = get(COMPLETION_TOKENS_KEYS[0])
        if type(completion_tokens) is not int or not 0 <= completion_tokens < INT64_LIMIT:
            completion_tokens = _count(attrs, COMPLETION_TOKENS_KEYS)
        if completion_tokens is None:
            raise SpanMappingError(f"missing attribute {COMPLETION_TOKENS_KEYS[0]}")
        if start_ns == 0:
            raise SpanMappingError("span has no start time (startTimeUnixNano is 0 or absent)")
        if end_ns < start_ns:
            raise SpanMappingError("span ends before it starts")
        if start_ns < 0 or end_ns >= INT64_LIMIT:
            raise SpanMappingError(
                f"span times must be unix nanoseconds from 0 to below 2^63 (the year 2262), got "
                f"start {start_ns} and end {end_ns}"
            )
        max_tokens = get(_MAX_TOKENS_KEYS[0])
        if max_tokens is not None and (
            type(max_tokens) is not int or not 0 <= max_tokens < INT64_LIMIT
        ):
            max_tokens = _count(attrs, _MAX_TOKENS_KEYS)
        row = self.span_dimensions(attrs, resource_dimensions)
        error_type = get(ERROR_TYPE_KEY)
        request_id = get(REQUEST_ID_KEY)
        self.rows.append(
            (
                trace_id,
                span_id,
                request_id if request_id is None or type(request_id) is str else str(request_id),
                *row,  # the dimensions, conversation and adapter, then emulated
                status_code != STATUS_ERROR and error_type is None,
                None if error_type is None else str(error_type),
                prompt_tokens,
                completion_tokens,
                *latencies,
                max_tokens,
                source,
                start_ns,
                end_ns,
                None,  # ingested_ts: stamped by the store
            )
        )

    def span_dimensions(
        self, attrs: Mapping[str, AttrValue], resource: ResourceDimensions
    ) -> tuple[object, ...]:
        """A request row's dimensions and emulated flag (DIMENSIONS order): the resource's,
        unless the span's attributes `attrs` name some."""
        present = self._span_level_keys.intersection(attrs)
        if present:
            return self._span_dimensions(attrs, present, resource)
        return resource.row

    def add_frame(self, frame: pl.DataFrame) -> None:
        """Append rows already framed as `to_frame` frames them (a column-wise decoder's)."""
        if self.rows:
            self._frames.append(self._rows_frame())
            self.rows = []
        self._frames.append(frame)

    def _span_dimensions(
        self,
        attrs: Mapping[str, AttrValue],
        present: frozenset[str],
        resource: ResourceDimensions,
    ) -> tuple[object, ...]:
        """The row's dimensions when the span carries some itself (a gateway sets them): they
        win over the resource's. A replica the span names is matched to its target again, and
        the adapter follows the span's model unless an attribute names it."""
        dims = list(resource.row)
        base_model = resource.base_model
        named: set[int] = set()
        for index, keys in self._span_dimension_lookups(present):
            found = _first(attrs, keys)
            if found is not None:
                dims[index] = found
                named.add(index)
        if _REPLICA in named:
            target = self.targets.by_replica.get(cast("str", dims[_REPLICA]))
            if target is not None:
                for index, label in (
                    (_HOST, target.host),
                    (_ZONE, target.zone),
                    (_POOL, target.pool),
                ):
                    dims[index] = dims[index] or label
                base_model = target.model or self.mapping.default_model
                if _MODEL not in named and resource.row[_MODEL] == resource.base_model:
                    dims[_MODEL] = base_model
        if named & {_REPLICA, _MODEL, _ADAPTER}:
            adapter = dims[_ADAPTER] if _ADAPTER in named else resource.adapter
            dims[_ADAPTER] = _adapter(
                cast("str | None", adapter), cast("str | None", dims[_MODEL]), base_model
            )
        return tuple(dims)

    def _span_dimension_lookups(
        self, present: frozenset[str]
    ) -> tuple[tuple[int, tuple[str, ...]], ...]:
        """The dimensions whose keys include one of `present` (span attribute keys), cached:
        spans of one deployment carry the same keys."""
        found = self._span_lookup_cache.get(present)
        if found is None:
            found = tuple(
                (index, keys)
                for index, keys, key_set in self._dimension_lookups
                if not key_set.isdisjoint(present)
            )
            self._span_lookup_cache[present] = found
        return found

    def to_frame(self) -> pl.DataFrame:
        frames = self._frames
        if frames and self.rows:
            frames = [*frames, self._rows_frame()]
        if not frames:
            frame = self._rows_frame()
        else:
            frame = frames[0] if len(frames) == 1 else pl.concat(frames)
        # One export may carry the same span twice (retries); keep the first. Span ids alone
        # are 64 random bits: when they are all distinct so are the keys, and frame is as is.
        if frame["span_id"].n_unique() == frame.height:
            return frame
        return frame.unique(subset=["trace_id", "span_id"], keep="first", maintain_order=True)

    def _rows_frame(self) -> pl.DataFrame:
        columns = list(zip(*self.rows, strict=True)) if self.rows else [()] * len(_ROW_COLUMNS)
        # One typed Series per column: cheaper than a frame built from the whole row set.
        return pl.DataFrame(
            [
                _timestamps(name, column)
                if name in _TIMESTAMP_COLUMNS
                else pl.Series(name, column, dtype=REQUESTS_SCHEMA[name])
                for name, column in zip(_ROW_COLUMNS, columns, strict=True)
            ]
        ).select(REQUESTS_SCHEMA.names())


_TIMESTAMP_COLUMNS = frozenset({"arrival_ts", "end_ts"})


def _timestamps(name: str, unix_ns: Sequence[object]) -> pl.Series:
    return pl.Series(name, unix_ns, dtype=pl.Int64).cast(pl.Datetime("ns")).dt.cast_time_unit("us")
