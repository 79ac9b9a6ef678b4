"""OTLP/JSON trace encoding: ExportTraceServiceRequest documents decoded into flat spans.

Follows the OTLP/JSON rules (what the OpenTelemetry Collector's file exporter writes):
`traceId`/`spanId` are hex strings, enums may be integers or names, 64-bit integers may be
strings. Protobuf's generic JSON mapping (base64 ids, snake_case keys) is accepted too, because
hand-written and older tools emit it. A broken span is reported with its path inside the
document and the other spans of the document are kept.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

AttrValue = str | int | float | bool | bytes | list[Any] | dict[str, Any] | None

SPAN_KIND_NAMES = {
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}
STATUS_CODE_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}
STATUS_ERROR = 2

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


class OtlpJsonError(ValueError):
    """A value in an OTLP/JSON document is not what the encoding allows; `path` says where."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def within(self, prefix: str) -> OtlpJsonError:
        """The same error seen from an enclosing object: paths are built only on failure."""
        joiner = "" if self.path.startswith("[") or not self.path else "."
        return OtlpJsonError(f"{prefix}{joiner}{self.path}", self.message)


@dataclass(frozen=True, slots=True)
class Span:
    trace_id: str
    span_id: str
    name: str
    kind: int
    start_unix_ns: int
    end_unix_ns: int
    status_code: int
    attributes: Mapping[str, AttrValue]
    resource: Mapping[str, AttrValue]


@dataclass(frozen=True, slots=True)
class DecodedRequest:
    """What one ExportTraceServiceRequest yielded: good spans, and an error per bad one."""

    spans: list[Span] = field(default_factory=list)
    errors: list[OtlpJsonError] = field(default_factory=list)


def _get(obj: Mapping[str, Any], camel: str, snake: str) -> Any:
    value = obj.get(camel)
    return obj.get(snake) if value is None else value


def _as_list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpJsonError(path, f"expected a JSON array, got {type(value).__name__}")
    return value


def _as_object(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise OtlpJsonError(path, f"expected a JSON object, got {type(value).__name__}")
    return value


def decode_uint64(value: Any, path: str) -> int:
    """64-bit integers arrive as JSON numbers or as decimal strings."""
    if isinstance(value, bool):
        raise OtlpJsonError(path, "expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise OtlpJsonError(path, f"expected an integer or a decimal string, got {value!r}")


def decode_id(value: Any, path: str, *, n_bytes: int) -> str:
    """A trace or span id as lowercase hex; base64 (protobuf's generic mapping) is converted."""
    if isinstance(value, str) and len(value) == 2 * n_bytes and _HEX_DIGITS.issuperset(value):
        return value.lower()
    if not isinstance(value, str) or not value:
        raise OtlpJsonError(path, f"expected a {n_bytes}-byte id as hex, got {value!r}")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) == n_bytes:
        return raw.hex()
    raise OtlpJsonError(
        path, f"expected a {n_bytes}-byte id as {2 * n_bytes} hex digits, got {value!r}"
    )


def _decode_enum(value: Any, names: Mapping[str, int], path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value in names:
        return names[value]
    raise OtlpJsonError(path, f"expected one of {sorted(names)} or an integer, got {value!r}")


def _decode_double(value: Any, path: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if value in special:
            return special[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise OtlpJsonError(path, f"expected a number, got {value!r}")


def decode_any_value(value: Any) -> AttrValue:  # noqa: PLR0911, PLR0912 (one branch per kind)
    """An OTLP AnyValue object as a plain Python value; error paths are relative to it."""
    obj = _as_object(value, "")
    if not obj:
        return None
    if "stringValue" in obj:
        return str(obj["stringValue"])
    if "intValue" in obj:
        return decode_uint64(obj["intValue"], "intValue")
    if "doubleValue" in obj:
        return _decode_double(obj["doubleValue"], "doubleValue")
    if "boolValue" in obj:
        flag = obj["boolValue"]
        if not isinstance(flag, bool):
            raise OtlpJsonError("boolValue", f"expected true or false, got {flag!r}")
        return flag
    if "arrayValue" in obj:
        items = _as_list(_as_object(obj["arrayValue"], "arrayValue").get("values"), "values")
        out: list[Any] = []
        for i, item in enumerate(items):
            try:
                out.append(decode_any_value(item))
            except OtlpJsonError as exc:
                raise exc.within(f"arrayValue.values[{i}]") from exc
        return out
    if "kvlistValue" in obj:
        kvlist = _as_object(obj["kvlistValue"], "kvlistValue")
        try:
            return decode_attributes(kvlist.get("values"))
        except OtlpJsonError as exc:
            raise exc.within("kvlistValue.values") from exc
    if "bytesValue" in obj:
        try:
            return base64.b64decode(obj["bytesValue"], validate=True)
        except (binascii.Error, ValueError, TypeError) as exc:
            raise OtlpJsonError("bytesValue", "expected base64") from exc
    for snake in ("string_value", "int_value", "double_value", "bool_value"):
        if snake in obj:
            return decode_any_value({snake.split("_")[0] + "Value": obj[snake]})
    raise OtlpJsonError("", f"unknown AnyValue kind {sorted(obj)}")


def decode_attributes(items: Any) -> dict[str, AttrValue]:
    """A list of KeyValue objects as a dict; error paths are relative to the list."""
    out: dict[str, AttrValue] = {}
    for i, entry in enumerate(_as_list(items, "")):
        # Fast path for the common scalar kinds; anything unusual takes the checked path.
        if type(entry) is dict:
            key = entry.get("key")
            value = entry.get("value")
            if type(key) is str and type(value) is dict and len(value) == 1:
                if type(scalar := value.get("stringValue")) is str:
                    out[key] = scalar
                    continue
                if type(scalar := value.get("doubleValue")) is float:
                    out[key] = scalar
                    continue
                if type(scalar := value.get("intValue")) is str and scalar.isdigit():
                    out[key] = int(scalar)
                    continue
        try:
            entry_obj = _as_object(entry, "")
            key = entry_obj.get("key")
            if not isinstance(key, str):
                raise OtlpJsonError("key", f"expected a string, got {key!r}")
            try:
                out[key] = decode_any_value(entry_obj.get("value", {}))
            except OtlpJsonError as exc:
                raise exc.within("value") from exc
        except OtlpJsonError as exc:
            raise exc.within(f"[{i}]") from exc
    return out


def decode_span(obj: Any, resource: Mapping[str, AttrValue]) -> Span:
    """One span object; error paths are relative to it."""
    span = _as_object(obj, "")
    status = _as_object(span.get("status") or {}, "status")
    try:
        attributes = decode_attributes(span.get("attributes"))
    except OtlpJsonError as exc:
        raise exc.within("attributes") from exc
    return Span(
        trace_id=decode_id(_get(span, "traceId", "trace_id"), "traceId", n_bytes=16),
        span_id=decode_id(_get(span, "spanId", "span_id"), "spanId", n_bytes=8),
        name=str(span.get("name", "")),
        kind=_decode_enum(span.get("kind"), SPAN_KIND_NAMES, "kind"),
        # proto3 JSON leaves out fields holding their default, so an absent time means 0.
        start_unix_ns=decode_uint64(
            _get(span, "startTimeUnixNano", "start_time_unix_nano") or 0, "startTimeUnixNano"
        ),
        end_unix_ns=decode_uint64(
            _get(span, "endTimeUnixNano", "end_time_unix_nano") or 0, "endTimeUnixNano"
        ),
        status_code=_decode_enum(status.get("code"), STATUS_CODE_NAMES, "status.code"),
        attributes=attributes,
        resource=resource,
    )


def _scope_spans_key(resource_spans: Mapping[str, Any]) -> str:
    # Exports from before OTLP 0.15 call this level instrumentationLibrarySpans.
    for candidate in ("scopeSpans", "scope_spans", "instrumentationLibrarySpans"):
        if candidate in resource_spans:
            return candidate
    return "scopeSpans"


def decode_trace_request(doc: Any) -> DecodedRequest:
    """Decode one ExportTraceServiceRequest; broken spans become errors, the rest are kept."""
    result = DecodedRequest()
    try:
        root = _as_object(doc, "$")
        resource_spans = _as_list(_get(root, "resourceSpans", "resource_spans"), "resourceSpans")
    except OtlpJsonError as exc:
        result.errors.append(exc)
        return result
    for r, rs in enumerate(resource_spans):
        try:
            rs_obj = _as_object(rs, "")
            resource_obj = _as_object(rs_obj.get("resource") or {}, "resource")
            try:
                resource = decode_attributes(resource_obj.get("attributes"))
            except OtlpJsonError as exc:
                raise exc.within("resource.attributes") from exc
            scopes_key = _scope_spans_key(rs_obj)
            scope_spans = _as_list(rs_obj.get(scopes_key), scopes_key)
        except OtlpJsonError as exc:
            result.errors.append(exc.within(f"resourceSpans[{r}]"))
            continue
        for s, ss in enumerate(scope_spans):
            try:
                spans = _as_list(_as_object(ss, "").get("spans"), "spans")
            except OtlpJsonError as exc:
                result.errors.append(exc.within(f"resourceSpans[{r}].{scopes_key}[{s}]"))
                continue
            for i, span in enumerate(spans):
                try:
                    result.spans.append(decode_span(span, resource))
                except OtlpJsonError as exc:
                    where = f"resourceSpans[{r}].{scopes_key}[{s}].spans[{i}]"
                    result.errors.append(exc.within(where))
    return result


@dataclass(frozen=True, slots=True)
class FileChunk:
    """One document of a trace file: where it came from (`line`, 1-based) and what it held."""

    line: int
    decoded: DecodedRequest
    size_bytes: int


def _open_bytes(path: Path) -> io.BufferedIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return path.open("rb")


def read_trace_file(path: Path) -> Iterator[FileChunk]:
    """Stream the documents of an OTLP/JSON trace file.

    Two layouts are accepted: JSON lines (one ExportTraceServiceRequest per line, as the
    Collector's file exporter writes) and a single, possibly pretty-printed, JSON document.
    A line that is not valid JSON yields a chunk carrying that error; reading goes on.
    """
    with _open_bytes(path) as stream:
        first_line_no = 0
        first_line = b""
        for line_no, raw in enumerate(stream, start=1):
            if raw.strip():
                first_line_no, first_line = line_no, raw
                break
        else:
            return
        try:
            yield _chunk(first_line_no, orjson.loads(first_line), len(first_line))
        except orjson.JSONDecodeError as first_error:
            rest = stream.read()
            whole = first_line + rest
            try:
                doc = orjson.loads(whole)
            except orjson.JSONDecodeError:
                yield _bad_line(first_line_no, first_error, len(first_line))
                yield from _read_lines(rest.splitlines(keepends=True), first_line_no + 1)
            else:
                yield _chunk(first_line_no, doc, len(whole))
            return
        yield from _read_lines(stream, first_line_no + 1)


def _read_lines(lines: Iterable[bytes], start: int) -> Iterator[FileChunk]:
    for line_no, raw in enumerate(lines, start=start):
        if not raw.strip():
            continue
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            yield _bad_line(line_no, exc, len(raw))
            continue
        yield _chunk(line_no, doc, len(raw))


def _chunk(line_no: int, doc: Any, size: int) -> FileChunk:
    return FileChunk(line=line_no, decoded=decode_trace_request(doc), size_bytes=size)


def _bad_line(line_no: int, exc: orjson.JSONDecodeError, size: int) -> FileChunk:
    error = OtlpJsonError("$", f"not valid JSON: {exc.msg} at column {exc.colno}")
    return FileChunk(line=line_no, decoded=DecodedRequest(errors=[error]), size_bytes=size)
