"""OTLP JSON-lines span files: the OpenTelemetry Collector file exporter's format, from the SDK.

The spans are encoded by the SDK's own OTLP encoder (the protobuf a real exporter would send)
and written as one ExportTraceServiceRequest per line in OTLP/JSON: hex ids, integer enums,
64-bit integers as strings.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Sequence
from typing import IO, Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

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


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> str:
    """One ExportTraceServiceRequest for `spans`, as a single line of OTLP/JSON."""
    message = encode_spans(spans)
    doc = json_format.MessageToDict(message, use_integers_for_enums=True)
    _ids_to_hex(doc)

    return json.dumps(doc, separators=(",", ":"), sort_keys=False)


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
