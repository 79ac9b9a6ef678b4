"""The receiver's protobuf fast path maps exactly like a full decode followed by `RequestRows.add`,
and a recording's OTLP/JSON line of a protobuf body decodes to the same spans."""

from __future__ import annotations

from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from servewatch.collectors.fixture.recording import otlp_json_line
from servewatch.collectors.traces.otlp_json import decode_trace_request
from servewatch.collectors.traces.otlp_protobuf import decode_trace_request_bytes, map_request_spans
from servewatch.collectors.traces.request_spans import RequestRows, SpanMapping, SpanMappingError

T0_NS = 1_795_000_000 * 10**9


def kv(key: str, value: Any) -> KeyValue:
    entry = KeyValue(key=key)
    if isinstance(value, bool):
        entry.value.bool_value = value
    elif isinstance(value, str):
        entry.value.string_value = value
    elif isinstance(value, int):
        entry.value.int_value = value
    elif isinstance(value, float):
        entry.value.double_value = value
    elif isinstance(value, list):
        entry.value.array_value.values.add().string_value = str(value[0])
    return entry


BASE: dict[str, Any] = {
    "gen_ai.latency.time_to_first_token": 0.25,
    "gen_ai.latency.e2e": 1.5,
    "gen_ai.usage.completion_tokens": 40,
}
VARIANTS: list[dict[str, Any]] = [
    {**BASE, "gen_ai.usage.prompt_tokens": 12, "gen_ai.request.id": "cmpl-1"},
    {**BASE, "gen_ai.latency.time_in_queue": 0.0, "gen_ai.latency.e2e": 2},  # zero, int
    {**BASE, "gen_ai.usage.completion_tokens": 0, "gen_ai.usage.input_tokens": 7},
    {
        "gen_ai.latency.time_to_first_token": 0.1,
        "gen_ai.latency.e2e": 0.9,
        "gen_ai.usage.output_tokens": 5.0,  # current GenAI name, integral double
        "gen_ai.usage.input_tokens": 3,
    },
    {**BASE, "gen_ai.latency.e2e": -1.0},  # negative: unusable
    {**BASE, "gen_ai.latency.e2e": "slow"},  # wrong kind: unusable
    {**BASE, "gen_ai.usage.completion_tokens": "40"},  # wrong kind: unusable
    {**BASE, "gen_ai.usage.completion_tokens": True},  # a boolean is no count
    {"gen_ai.latency.e2e": 1.0, "gen_ai.usage.completion_tokens": 1},  # no TTFT
    {**BASE, "servewatch.replica": "gw-9", "tenant.id": 42, "k8s.node.name": ""},
    {**BASE, "gen_ai.response.model": "m", "error.type": "timeout", "x.other": [1]},
    {**BASE, "gen_ai.request.max_tokens": 256, "gen_ai.request.id": 17},
    {**BASE, "servewatch.pool": ""},  # empty string: fall back to the resource
    {**BASE, "gen_ai.conversation.id": "conv-7", "session.id": "s-1"},  # the GenAI name wins
    {**BASE, "session.id": 99},  # a session id a gateway sent as a number
]


def request_body() -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(
        [kv("servewatch.replica", "vllm-3"), kv("servewatch.pool", "p1"), kv("host.name", "h")]
    )
    spans = resource_spans.scope_spans.add().spans
    for i, attributes in enumerate(VARIANTS):
        span = spans.add()
        span.trace_id = bytes([i + 1]) * 16
        span.span_id = bytes([i + 1]) * 8
        span.name = "llm_request"
        span.kind = 2
        span.start_time_unix_nano = T0_NS + i
        span.end_time_unix_nano = T0_NS + i + 10**9
        span.status.code = 2 if i == 10 else 0
        span.attributes.extend(kv(k, v) for k, v in attributes.items())
    other = spans.add()  # not a request span
    other.trace_id, other.span_id, other.name = b"\x09" * 16, b"\x09" * 8, "http"
    broken = spans.add()  # bad ids
    broken.trace_id, broken.span_id, broken.name = b"\x01", b"\x02" * 8, "llm_request"
    late = resource_spans.scope_spans.add().spans.add()  # ends before it starts
    late.trace_id, late.span_id, late.name = b"\x0a" * 16, b"\x0a" * 8, "llm_request"
    late.start_time_unix_nano, late.end_time_unix_nano = T0_NS + 5, T0_NS
    late.attributes.extend(kv(k, v) for k, v in BASE.items())
    return request.SerializeToString()


def slow_path(body: bytes, mapping: SpanMapping) -> tuple[RequestRows, list[tuple[str, str]]]:
    rows = RequestRows(mapping=mapping)
    unusable = []
    for span in decode_trace_request_bytes(body).spans:
        if rows.is_request(span):
            try:
                rows.add(span, source="s")
            except SpanMappingError as exc:
                unusable.append((span.span_id, str(exc)))
    return rows, unusable


def test_fast_mapping_equals_full_decode_and_add() -> None:
    body = request_body()
    for mapping in (SpanMapping(), SpanMapping(tenant_keys=("tenant.id",), pool_keys=("x",))):
        expected_rows, expected_unusable = slow_path(body, mapping)
        rows = RequestRows(mapping=mapping)
        mapped = map_request_spans(body, rows, source="s")
        assert rows.to_frame().equals(expected_rows.to_frame())
        assert mapped.unusable == expected_unusable
        assert [e.path for e in mapped.errors] == ["resourceSpans[0].scopeSpans[0].spans[16]"]
        assert mapped.spans == len(VARIANTS) + 3
        assert mapped.request_spans == len(VARIANTS) + 1
        assert len(rows) == 10  # four unusable variants, one missing TTFT, one ending early
        assert len(mapped.unusable) == 6
        conversations = rows.to_frame().get_column("conversation_id").drop_nulls()
        assert conversations.to_list() == ["conv-7", "99"]


def test_recorded_json_line_decodes_to_the_same_spans() -> None:
    body = request_body()
    from_json = decode_trace_request(orjson.loads(otlp_json_line(body, protobuf=True)))
    from_protobuf = decode_trace_request_bytes(body)
    assert from_json.spans == from_protobuf.spans
    assert len(from_json.errors) == len(from_protobuf.errors) == 1
