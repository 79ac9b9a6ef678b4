"""OTLP JSON-lines span files: the OpenTelemetry Collector file exporter's format, from the SDK.

The spans are encoded as the SDK's own OTLP encoder does (the protobuf a real exporter would
send) and written as one ExportTraceServiceRequest per line in OTLP/JSON: hex ids, integer
enums, 64-bit integers as strings. Plain spans (no parent, events or links, scalar attributes),
which is every span the emulator makes, are encoded straight to the same JSON document, about
twenty times faster than through protobuf; anything else goes through the SDK's encoder. Tests
hold the two paths to byte-for-byte equality.
"""

from __future__ import annotations

import base64
import json
import math
import threading
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import IO, Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import StatusCode

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _ids_to_hex(node: Any) -> None:
    """Protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants ids as hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _ids_to_hex(value)
    elif isinstance(node, list):
        for item in node:
            _ids_to_hex(item)


def protobuf_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """`spans` through the SDK's protobuf encoder and protobuf's JSON mapping (the reference)."""
    message = encode_spans(spans)
    doc = json_format.MessageToDict(message, use_integers_for_enums=True)
    _ids_to_hex(doc)
    return json.dumps(doc, separators=(",", ":"), sort_keys=False)


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """One ExportTraceServiceRequest for `spans`, as a single line of OTLP/JSON."""
    line = _direct_line(spans)
    return protobuf_otlp_json(spans) if line is None else line


_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# Span flags: the SDK always sets SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE; a plain span has no parent.
_FLAGS_HAS_IS_REMOTE = 0x100
_dumps = json.JSONEncoder(separators=(",", ":")).encode


class _NotPlainError(Exception):
    """A span needs the general (protobuf) encoder."""


_KEY_PREFIXES: dict[str, str] = {}  # attribute keys repeat on every span: encode each once


def key_prefix(key: str) -> str:
    """The start of a KeyValue for `key`, up to its value's type: `{"key":"...","value":{`."""
    return _KEY_PREFIXES.get(key) or _key_prefix(key)


def json_string(value: str) -> str:
    """`value` as a JSON string, escaped as the rest of the line is (what `_dumps` does for a
    string, without its dispatch)."""
    return encode_basestring_ascii(value)


def resource_spans_parts(resource: Resource, scope: InstrumentationScope | None) -> tuple[str, str]:
    """The text of one ResourceSpans entry (one scope) before and after its comma-joined spans,
    as `spans_to_otlp_json` writes it; raises ValueError for what it would not write directly."""
    try:
        attributes = _key_values(resource.attributes)
        scope_json = _scope_json(scope)
    except _NotPlainError as exc:
        raise ValueError(f"resource {dict(resource.attributes)} needs the protobuf path") from exc
    resource_json = '{"attributes":[' + attributes + "]}" if attributes else "{}"
    before = '{"resource":' + resource_json + ',"scopeSpans":[{"scope":' + scope_json + ',"spans":['
    after = "]"
    if scope is not None and scope.schema_url:
        after += ',"schemaUrl":' + _dumps(scope.schema_url)
    after += "}]"
    if resource.schema_url:
        after += ',"schemaUrl":' + _dumps(resource.schema_url)
    return before, after + "}"


def export_line(resource_spans: Sequence[str]) -> str:
    """One ExportTraceServiceRequest line from ResourceSpans entries."""
    return '{"resourceSpans":[' + ",".join(resource_spans) + "]}"


def _key_prefix(key: str) -> str:
    prefix = _KEY_PREFIXES.get(key)
    if prefix is None:
        prefix = '{"key":' + _dumps(key) + ',"value":{'
        if len(_KEY_PREFIXES) < 4096:
            _KEY_PREFIXES[key] = prefix
    return prefix


def _key_values(attributes: Mapping[str, object] | None) -> str:
    """A KeyValue list as protobuf's JSON mapping writes it (int64 as a decimal string)."""
    if not attributes:
        return ""
    parts: list[str] = []
    append = parts.append
    for key, value in attributes.items():
        prefix = _KEY_PREFIXES.get(key) or _key_prefix(key)
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):  # type: ignore[arg-type]
                raise _NotPlainError
            append(f'{prefix}"doubleValue":{value!r}}}}}')
        elif kind is str:
            append(f'{prefix}"stringValue":{_dumps(value)}}}}}')
        elif kind is int:
            if not _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
                raise _NotPlainError
            append(f'{prefix}"intValue":"{value}"}}}}')
        elif kind is bool:
            append(f'{prefix}"boolValue":{"true" if value else "false"}}}}}')
        else:
            raise _NotPlainError
    return ",".join(parts)


def _scope_json(scope: InstrumentationScope | None) -> str:
    if scope is None:
        return "{}"
    if scope.attributes:
        raise _NotPlainError
    fields: list[str] = []
    if scope.name:
        fields.append('"name":' + _dumps(scope.name))
    if scope.version:
        fields.append('"version":' + _dumps(scope.version))
    return "{" + ",".join(fields) + "}"


def _span_json(span: ReadableSpan) -> str:
    context = span.context
    if (
        context is None
        or span.parent is not None
        or span.events
        or span.links
        or len(context.trace_state) > 0
        or span.dropped_attributes
        or span.dropped_events
        or span.dropped_links
    ):
        raise _NotPlainError
    # Fields in protobuf field-number order, defaults left out, as MessageToDict writes them.
    out = f'{{"traceId":"{context.trace_id:032x}","spanId":"{context.span_id:016x}"'
    if span.name:
        out += ',"name":' + _dumps(span.name)
    # The SDK's SpanKind starts at INTERNAL = 0, OTLP's at INTERNAL = 1.
    out += f',"kind":{span.kind.value + 1}'
    if span.start_time:
        out += f',"startTimeUnixNano":"{span.start_time}"'
    if span.end_time:
        out += f',"endTimeUnixNano":"{span.end_time}"'
    attributes = _key_values(span.attributes)
    if attributes:
        out += ',"attributes":[' + attributes + "]"
    status: list[str] = []
    if span.status.description:
        status.append('"message":' + _dumps(span.status.description))
    if span.status.status_code is not StatusCode.UNSET:
        status.append(f'"code":{span.status.status_code.value}')
    return out + ',"status":{' + ",".join(status) + f'}},"flags":{_FLAGS_HAS_IS_REMOTE}}}'


def _direct_line(spans: Sequence[ReadableSpan]) -> str | None:
    """The line `protobuf_otlp_json` would write, built directly; None when a span is not plain.

    Grouping and order follow `encode_spans`: by resource, then by scope, each in order of
    first appearance.
    """
    # Hashing a Resource serialises its attributes, so spans are grouped by resource identity
    # first and each new resource object is matched by equality once.
    groups: list[tuple[Resource, dict[InstrumentationScope | None, list[str]]]] = []
    group_of: dict[int, int] = {}
    try:
        for span in spans:
            index = group_of.get(id(span.resource))
            if index is None:
                index = next(
                    (i for i, (seen, _) in enumerate(groups) if seen == span.resource),
                    len(groups),
                )
                if index == len(groups):
                    groups.append((span.resource, {}))
                group_of[id(span.resource)] = index
            by_scope = groups[index][1]
            by_scope.setdefault(span.instrumentation_scope or None, []).append(_span_json(span))
        resource_parts: list[str] = []
        for resource, by_scope in groups:
            attributes = _key_values(resource.attributes)
            resource_json = '{"attributes":[' + attributes + "]}" if attributes else "{}"
            scope_parts: list[str] = []
            for scope, span_parts in by_scope.items():
                entry = '{"scope":' + _scope_json(scope) + ',"spans":[' + ",".join(span_parts)
                if scope is not None and scope.schema_url:
                    entry += '],"schemaUrl":' + _dumps(scope.schema_url) + "}"
                else:
                    entry += "]}"
                scope_parts.append(entry)
            entry = '{"resource":' + resource_json + ',"scopeSpans":[' + ",".join(scope_parts)
            if resource.schema_url:
                entry += '],"schemaUrl":' + _dumps(resource.schema_url) + "}"
            else:
                entry += "]}"
            resource_parts.append(entry)
    except _NotPlainError:
        return None
    return '{"resourceSpans":[' + ",".join(resource_parts) + "]}"


class OtlpJsonLinesExporter(SpanExporter):
    """Appends each export call as one line to a text stream."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = spans_to_otlp_json(spans)
        with self._lock:
            self._stream.write(line + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._stream.flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            self._stream.flush()
        return True
