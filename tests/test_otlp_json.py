"""OTLP/JSON decoding: round trip from the SDK's encoder, accepted variants, bad-input table."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from servewatch.collectors.traces.otlp_json import decode_trace_request, read_trace_file
from servewatch.emulator.otlp_jsonl import spans_to_otlp_json

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"


def span_doc(**overrides: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE_ID,
        "spanId": SPAN_ID,
        "name": "llm_request",
        "kind": 2,
        "startTimeUnixNano": "1795000000000000000",
        "endTimeUnixNano": "1795000001000000000",
        "attributes": [{"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1.0}}],
        "status": {},
    }
    span.update(overrides)
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "h1"}}]},
                "scopeSpans": [{"scope": {"name": "x"}, "spans": [span]}],
            }
        ]
    }


attribute_values = st.one_of(
    st.text(max_size=20),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)


@settings(max_examples=50, deadline=None)
@given(
    attributes=st.dictionaries(st.text(min_size=1, max_size=12), attribute_values, max_size=8),
    start_ns=st.integers(min_value=0, max_value=2**62),
    duration_ns=st.integers(min_value=0, max_value=10**12),
)
def test_round_trip_through_the_sdk_encoder(
    attributes: dict[str, Any], start_ns: int, duration_ns: int
) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "vllm", "k": 7}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    span = provider.get_tracer("t").start_span(
        "llm_request", kind=SpanKind.SERVER, start_time=start_ns, attributes=attributes
    )
    span.end(end_time=start_ns + duration_ns)
    (finished,) = memory.get_finished_spans()

    decoded = decode_trace_request(json.loads(spans_to_otlp_json([finished])))

    assert decoded.errors == []
    (got,) = decoded.spans
    assert finished.context is not None
    assert got.trace_id == f"{finished.context.trace_id:032x}"
    assert got.span_id == f"{finished.context.span_id:016x}"
    assert (got.name, got.kind) == ("llm_request", 2)
    assert (got.start_unix_ns, got.end_unix_ns) == (start_ns, start_ns + duration_ns)
    assert dict(got.attributes) == attributes
    assert got.resource["service.name"] == "vllm"
    assert got.resource["k"] == 7


def test_generic_protobuf_json_variants_are_accepted() -> None:
    doc = span_doc(
        traceId="CvdlGRbNQ92ESOshHIAxnA==",  # the same id, base64 as json_format writes it
        spanId="t61rcWkgMzE=",
        kind="SPAN_KIND_SERVER",
        startTimeUnixNano=1795000000000000000,
        status={"code": "STATUS_CODE_ERROR"},
    )
    (span,) = decode_trace_request(doc).spans
    assert (span.trace_id, span.span_id) == (TRACE_ID, SPAN_ID)
    assert (span.kind, span.status_code) == (2, 2)
    assert span.start_unix_ns == 1795000000000000000


def test_instrumentation_library_spans_of_old_exports_are_read() -> None:
    doc = span_doc()
    rs = doc["resourceSpans"][0]
    rs["instrumentationLibrarySpans"] = rs.pop("scopeSpans")
    assert len(decode_trace_request(doc).spans) == 1


BAD_SPANS = [
    ({"traceId": "abc"}, "spans[0].traceId", "16-byte id"),
    ({"traceId": "zz" * 16}, "spans[0].traceId", "16-byte id"),
    ({"spanId": None}, "spans[0].spanId", "8-byte id"),
    ({"startTimeUnixNano": "soon"}, "spans[0].startTimeUnixNano", "integer"),
    ({"endTimeUnixNano": True}, "spans[0].endTimeUnixNano", "boolean"),
    ({"kind": "SPAN_KIND_WEIRD"}, "spans[0].kind", "one of"),
    ({"status": {"code": "NOPE"}}, "spans[0].status.code", "one of"),
    ({"attributes": {"a": 1}}, "spans[0].attributes", "JSON array"),
    ({"attributes": [{"key": 3, "value": {}}]}, "spans[0].attributes[0].key", "string"),
    (
        {"attributes": [{"key": "a", "value": {"intValue": "x"}}]},
        "spans[0].attributes[0].value.intValue",
        "integer",
    ),
    (
        {"attributes": [{"key": "a", "value": {"boolValue": "yes"}}]},
        "spans[0].attributes[0].value.boolValue",
        "true or false",
    ),
    (
        {"attributes": [{"key": "a", "value": {"mystery": 1}}]},
        "spans[0].attributes[0].value",
        "unknown AnyValue",
    ),
]


@pytest.mark.parametrize(("override", "path", "message"), BAD_SPANS)
def test_bad_span_names_its_path_and_other_spans_survive(
    override: dict[str, Any], path: str, message: str
) -> None:
    doc = span_doc(**override)
    good = span_doc()["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"].append(good)
    decoded = decode_trace_request(doc)
    assert len(decoded.spans) == 1
    (error,) = decoded.errors
    assert error.path.endswith(path)
    assert error.path.startswith("resourceSpans[0].scopeSpans[0]")
    assert message in error.message


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "JSON object"),
        ({"resourceSpans": {}}, "JSON array"),
        ({"resourceSpans": [1]}, "object"),
    ],
)
def test_bad_document_shapes(doc: Any, message: str) -> None:
    decoded = decode_trace_request(doc)
    assert decoded.spans == []
    assert message in decoded.errors[0].message


def test_file_layouts_lines_pretty_and_gzip(tmp_path: Path) -> None:
    one = json.dumps(span_doc())
    lines = tmp_path / "a.jsonl"
    lines.write_text(f"{one}\n\n{one}\n", encoding="utf-8")
    assert [c.line for c in read_trace_file(lines)] == [1, 3]

    pretty = tmp_path / "b.json"
    pretty.write_text(json.dumps(span_doc(), indent=2), encoding="utf-8")
    chunks = list(read_trace_file(pretty))
    assert len(chunks) == 1
    assert len(chunks[0].decoded.spans) == 1

    packed = tmp_path / "c.jsonl.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as out:
        out.write(one + "\n" + one + "\n")
    assert sum(len(c.decoded.spans) for c in read_trace_file(packed)) == 2


def test_malformed_lines_are_reported_by_number_and_the_rest_kept(tmp_path: Path) -> None:
    one = json.dumps(span_doc())
    path = tmp_path / "mixed.jsonl"
    path.write_text(f"{{not json\n{one}\n{one[:40]}\n{one}\n", encoding="utf-8")
    chunks = list(read_trace_file(path))
    bad = [(c.line, c.decoded.errors[0].message) for c in chunks if c.decoded.errors]
    assert [line for line, _ in bad] == [1, 3]
    assert all("not valid JSON" in message for _, message in bad)
    assert [c.line for c in chunks if c.decoded.spans] == [2, 4]
