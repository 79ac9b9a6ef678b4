"""OTLP protobuf trace encoding: ExportTraceServiceRequest bytes decoded into flat spans.

The same `Span` records as the OTLP/JSON decoder, so one request mapping serves both.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from collectors.otlp_json import AttrValue, DecodedRequest, OtlpJsonError, Span


class OtlpProtobufError(ValueError):
    """The body is not a protobuf ExportTraceServiceRequest."""


def _any_value(value: AnyValue) -> AttrValue:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_dict(value.kvlist_value.values)
    result: Any = getattr(value, kind)
    return result  # type: ignore[no-any-return]


def attributes_dict(items: Any) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for kv in items:
        entry: KeyValue = kv
        out[entry.key] = _any_value(entry.value)
    return out


def decode_trace_request_bytes(body: bytes) -> DecodedRequest:
    """Decode one protobuf ExportTraceServiceRequest; a span with bad ids becomes an error."""
    try:
        request = ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise OtlpProtobufError(f"not a protobuf ExportTraceServiceRequest: {exc}") from exc
    result = DecodedRequest()
    for r, rs in enumerate(request.resource_spans):
        resource = attributes_dict(rs.resource.attributes)
        for s, ss in enumerate(rs.scope_spans):
            for i, span in enumerate(ss.spans):
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    where = f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]"
                    result.errors.append(
                        OtlpJsonError(
                            where,
                            f"trace id must be 16 bytes and span id 8, got {len(trace_id)} "
                            f"and {len(span_id)}",
                        )
                    )
                    continue
                result.spans.append(
                    Span(
                        trace_id=trace_id.hex(),
                        span_id=span_id.hex(),
                        name=span.name,
                        kind=span.kind,
                        start_unix_ns=span.start_time_unix_nano,
                        end_unix_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attributes=attributes_dict(span.attributes),
                        resource=resource,
                    )
                )
    return result
