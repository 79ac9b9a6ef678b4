"""OTLP protobuf trace encoding: ExportTraceServiceRequest bytes decoded into flat spans.

`decode_trace_request_bytes` yields the same `Span` records as the OTLP/JSON decoder, so one
request mapping serves both. `map_request_spans` is the receiver's hot path. A plain body (the
usual case) is read by the compiled decoder (`otlp_native`) straight into request columns; any
other body, or every body when no build is loaded, takes the reference path: after protobuf has
parsed (and so validated) the body, it reads the spans again through a schema of our own that
keeps attributes as encoded KeyValue bytes, and reads only the attributes the mapping uses,
straight from those bytes when they are encoded as SDKs encode them (anything else goes through
the full decode of that one attribute), into `RequestRows.add_request` without building a Span.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from servewatch.collectors.traces import otlp_native
from servewatch.collectors.traces.otlp_json import AttrValue, DecodedRequest, OtlpJsonError, Span
from servewatch.collectors.traces.request_spans import RequestRows, SpanMappingError


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


def _parsed(body: bytes) -> ExportTraceServiceRequest:
    try:
        return ExportTraceServiceRequest.FromString(body)
    except DecodeError as exc:
        raise OtlpProtobufError(f"not a protobuf ExportTraceServiceRequest: {exc}") from exc


def _id_error(r: int, s: int, i: int, trace_id: bytes, span_id: bytes) -> OtlpJsonError:
    return OtlpJsonError(
        f"resourceSpans[{r}].scopeSpans[{s}].spans[{i}]",
        f"trace id must be 16 bytes and span id 8, got {len(trace_id)} and {len(span_id)}",
    )


def decode_trace_request_bytes(body: bytes) -> DecodedRequest:
    """Decode one protobuf ExportTraceServiceRequest; a span with bad ids becomes an error."""
    request = _parsed(body)
    result = DecodedRequest()
    for r, rs in enumerate(request.resource_spans):
        resource = attributes_dict(rs.resource.attributes)
        for s, ss in enumerate(rs.scope_spans):
            for i, span in enumerate(ss.spans):
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    result.errors.append(_id_error(r, s, i, trace_id, span_id))
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


@dataclass(slots=True)
class MappedRequest:
    """What one export contributed to a `RequestRows`: counts, and why spans were refused."""

    spans: int = 0
    request_spans: int = 0
    errors: list[OtlpJsonError] = field(default_factory=list)
    # (span id as hex, reason) of request spans the mapping could not use
    unusable: list[tuple[str, str]] = field(default_factory=list)


def map_request_spans(body: bytes, rows: RequestRows, *, source: str) -> MappedRequest:
    """Decode one ExportTraceServiceRequest and add its request spans to `rows`.

    The same rows and errors as `decode_trace_request_bytes` followed by `rows.add` per request
    span, without decoding what the mapping never reads.
    """
    columns = otlp_native.decode(body, rows.mapping)
    if columns is not None:
        return _map_columns(columns, rows, source)
    return map_request_spans_reference(body, rows, source=source)


def map_request_spans_reference(body: bytes, rows: RequestRows, *, source: str) -> MappedRequest:
    """`map_request_spans` without the compiled decoder: what it must equal, and what decides
    (and words) every refusal."""
    # The generated classes parse (and so validate) everything: what they refuse is refused.
    _parsed(body)
    return _map_flat(body, rows, source)


def _map_columns(columns: otlp_native.Columns, rows: RequestRows, source: str) -> MappedRequest:
    """`map_request_spans` of a body the compiled decoder read: the dimensions are mapped once
    per resource and per distinct set of span-level dimension values, then gathered."""
    resources = [
        rows.resource_dimensions(
            attributes_dict(Resource.FromString(encoded).attributes if encoded else ())
        )
        for encoded in columns.resources
    ]
    if columns.rows:
        dimension_rows = [
            rows.span_dimensions(dict(values), resources[index]) for index, values in columns.combos
        ]
        rows.add_frame(otlp_native.request_frame(columns, dimension_rows, source))
    return MappedRequest(spans=columns.spans, request_spans=columns.rows)


# -- the flat reader ---------------------------------------------------------------------------
# The same wire format read through a schema of our own: spans keep only the fields the mapping
# reads, and their attributes stay encoded KeyValue bytes. Protobuf builds that list in C, and a
# KeyValue in the encoding SDKs write (key, then one value) is read with a few byte comparisons;
# one wrapper object per attribute and per value is what made the generated classes slow. Field
# numbers and types are those of opentelemetry-proto's trace.proto.
_F = descriptor_pb2.FieldDescriptorProto


def _flat_request_class() -> Any:
    package = "servewatch.otlp_flat"
    file = descriptor_pb2.FileDescriptorProto(
        name="servewatch/otlp_flat.proto",
        package=package,
        syntax="proto3",
        dependency=[
            "opentelemetry/proto/trace/v1/trace.proto",
            "opentelemetry/proto/resource/v1/resource.proto",
        ],
    )
    one, many = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    messages: dict[str, list[tuple[str, int, int, int, str]]] = {
        "Span": [
            ("trace_id", 1, _F.TYPE_BYTES, one, ""),
            ("span_id", 2, _F.TYPE_BYTES, one, ""),
            ("name", 5, _F.TYPE_STRING, one, ""),
            ("start_time_unix_nano", 7, _F.TYPE_FIXED64, one, ""),
            ("end_time_unix_nano", 8, _F.TYPE_FIXED64, one, ""),
            ("attributes", 9, _F.TYPE_BYTES, many, ""),
            ("status", 15, _F.TYPE_MESSAGE, one, ".opentelemetry.proto.trace.v1.Status"),
        ],
        "ScopeSpans": [("spans", 2, _F.TYPE_MESSAGE, many, f".{package}.Span")],
        "ResourceSpans": [
            ("resource", 1, _F.TYPE_MESSAGE, one, ".opentelemetry.proto.resource.v1.Resource"),
            ("scope_spans", 2, _F.TYPE_MESSAGE, many, f".{package}.ScopeSpans"),
        ],
        "Request": [("resource_spans", 1, _F.TYPE_MESSAGE, many, f".{package}.ResourceSpans")],
    }
    for name, fields in messages.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = message.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName(f"{package}.Request")
    except KeyError:
        pool.Add(file)
        descriptor = pool.FindMessageTypeByName(f"{package}.Request")
    return message_factory.GetMessageClass(descriptor)


_FlatRequest = _flat_request_class()
_KEY, _VALUE = 0x0A, 0x12  # KeyValue fields 1 and 2, length-delimited
_STRING, _BOOL, _INT, _DOUBLE = 0x0A, 0x10, 0x18, 0x21  # AnyValue fields 1-4
_unpack_double = struct.Struct("<d").unpack_from


class _OtherEncodingError(Exception):
    """A KeyValue encoded otherwise than the flat reader reads it; the full decode takes it."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _any_value_at(buf: bytes, pos: int) -> AttrValue:
    """The AnyValue in buf[pos:] holding one string, bool, int or double field (or nothing)."""
    end = len(buf)
    if pos == end:
        return None
    tag = buf[pos]
    if tag in (_INT, _BOOL):
        number, after = _varint(buf, pos + 1)
        if after == end:
            if tag == _BOOL:
                return number != 0
            return number - (1 << 64) if number >> 63 else number  # int64 from its varint
    elif tag == _STRING:
        size, after = _varint(buf, pos + 1)
        if after + size == end:
            try:
                return buf[after:end].decode()
            except UnicodeDecodeError:
                pass
    raise _OtherEncodingError


def _key_value(kv: bytes, kind_of: Callable[[str], str | None]) -> tuple[str, AttrValue] | None:
    """A KeyValue's key and value if the mapping reads the key, by the full decode."""
    entry = KeyValue.FromString(kv)
    if kind_of(entry.key) is None:
        return None
    return entry.key, _any_value(entry.value)


@functools.lru_cache(maxsize=8)  # one per mapping in use; built once, read per export
def _value_prefixes(keys: tuple[str, ...]) -> dict[bytes, tuple[str, int, int]]:
    """How a KeyValue in the usual encoding begins, for each mapped key and value length under
    128: key field, then the value field's tag and length. Maps to (key, where the AnyValue
    starts, its length)."""
    prefixes = {}
    for key in keys:
        encoded = key.encode()
        if len(encoded) < 0x80:
            head = bytes([_KEY, len(encoded)]) + encoded + bytes([_VALUE])
            for size in range(1, 0x80):
                prefixes[head + bytes([size])] = (key, len(head) + 1, size)
    return prefixes


def _attribute_reader(
    kinds: dict[str, str],
) -> Callable[[Iterable[bytes]], dict[str, AttrValue]]:
    """Reads the mapped attributes (`kinds`' keys) of a span from its encoded KeyValues."""
    kind_of = kinds.get
    keys = {key.encode(): key for key in kinds}
    prefixes = _value_prefixes(tuple(kinds)).get
    unpack_double = _unpack_double

    def read(encoded: Iterable[bytes]) -> dict[str, AttrValue]:
        attributes: dict[str, AttrValue] = {}
        for kv in encoded:
            # The usual encoding (key, then one value running to the end) is read here;
            # anything else goes through the full decode.
            try:
                hit = prefixes(kv[: kv[1] + 4])
            except IndexError:  # shorter than any key-value pair with both fields
                hit = None
            if hit is not None:
                key, at, size = hit
                if len(kv) == at + size:
                    tag = kv[at]
                    if tag == _DOUBLE and size == 9:
                        attributes[key] = unpack_double(kv, at + 1)[0]
                        continue
                    if tag == _INT and size == 2:
                        attributes[key] = kv[at + 1]  # the varint's only byte
                        continue
                    if tag == _INT and size == 3 and kv[at + 1] >= 0x80 > kv[at + 2]:
                        attributes[key] = (kv[at + 1] & 0x7F) | kv[at + 2] << 7  # 128 to 16383
                        continue
                    if tag == _STRING and kv[at + 1] == size - 2:
                        try:
                            attributes[key] = kv[at + 2 :].decode()
                            continue
                        except UnicodeDecodeError:
                            pass
                    try:
                        attributes[key] = _any_value_at(kv, at)
                        continue
                    except _OtherEncodingError:
                        pass
            elif (
                len(kv) > 3
                and kv[0] == _KEY
                and kv[1] < 0x80
                and kv[1] + 4 <= len(kv)
                and kv[kv[1] + 2] == _VALUE
                and kv[kv[1] + 3] == len(kv) - kv[1] - 4
                and kv[2 : kv[1] + 2] not in keys
            ):
                continue  # the usual encoding, of a key the mapping does not read
            found = _key_value(kv, kind_of)
            if found is not None:
                attributes[found[0]] = found[1]
        return attributes

    return read


def _map_flat(body: bytes, rows: RequestRows, source: str) -> MappedRequest:
    """`map_request_spans` of a body protobuf has parsed without error."""
    result = MappedRequest()
    kinds = rows.attribute_kinds()
    read_attributes = _attribute_reader(kinds)
    span_name = rows.mapping.span_name
    add = rows.add_request
    for r, rs in enumerate(_FlatRequest.FromString(body).resource_spans):
        dims = rows.resource_dimensions(attributes_dict(rs.resource.attributes))
        for s, ss in enumerate(rs.scope_spans):
            spans = ss.spans
            result.spans += len(spans)
            for i, span in enumerate(spans):
                trace_id, span_id = span.trace_id, span.span_id
                if len(trace_id) != 16 or len(span_id) != 8:
                    result.errors.append(_id_error(r, s, i, trace_id, span_id))
                    continue
                if span.name != span_name:
                    continue
                result.request_spans += 1
                attributes = read_attributes(span.attributes)
                hex_span_id = span_id.hex()
                try:
                    add(
                        trace_id.hex(),
                        hex_span_id,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attrs=attributes,
                        resource_dimensions=dims,
                        source=source,
                    )
                except SpanMappingError as exc:
                    result.unusable.append((hex_span_id, str(exc)))
    return result
