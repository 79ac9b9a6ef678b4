"""The receiver's protobuf reader handles encodings SDKs do not write (fields out of order or
repeated, long lengths, unusual value kinds) exactly as the full decode does.

Bodies are assembled from raw protobuf fields, so the unusual encodings reach the reader as a
client could send them (a generated class would re-encode them the usual way).
"""

from __future__ import annotations

import struct

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from servewatch.collectors.traces.otlp_protobuf import decode_trace_request_bytes, map_request_spans
from servewatch.collectors.traces.request_spans import RequestRows, SpanMapping, SpanMappingError
from tests.protobuf_wire import field, varint

T0_NS = 1_795_000_000 * 10**9
LONG_KEY = "tenant." + "x" * 150


def double(value: float) -> bytes:
    return bytes([0x21]) + struct.pack("<d", value)


def integer(value: int) -> bytes:
    return bytes([0x18]) + varint(value)


def string(value: str) -> bytes:
    return field(1, value.encode())


def kv(key: str, any_value: bytes) -> bytes:
    return field(1, key.encode()) + field(2, any_value)


def usual(key: str, value: float | int | str) -> bytes:
    if isinstance(value, float):
        return kv(key, double(value))
    if isinstance(value, int):
        return kv(key, integer(value))
    return kv(key, string(value))


BASE = [
    usual("gen_ai.latency.time_to_first_token", 0.25),
    usual("gen_ai.latency.e2e", 1.5),
    usual("gen_ai.usage.completion_tokens", 40),
]
E2E = b"gen_ai.latency.e2e"
ARRAY = AnyValue()
ARRAY.array_value.values.add().string_value = "m"

# Each: the encoded KeyValues a request span carries besides BASE (added after it).
ODD_ATTRIBUTES: list[list[bytes]] = [
    [field(2, double(2.5)) + field(1, E2E)],  # value before key
    [field(1, b"x.other") + field(1, E2E) + field(2, double(3.0))],  # key twice: last wins
    [field(1, E2E) + field(1, b"x.other") + field(2, double(3.0))],  # ... and unmapped
    [field(1, b"x.other") + field(2, double(5.0)) + field(1, E2E)],  # key again after value
    [field(1, E2E) + field(2, string("slow")) + field(2, double(4.0))],  # two values merge
    [b""],  # an empty key-value pair
    [field(1, b"gen_ai.request.id")],  # a key without value
    [usual("gen_ai.request.id", "cmpl-7") + bytes([0x18, 0x01])],  # an unknown field after
    [usual("gen_ai.request.id", "r" * 300)],  # two-byte lengths
    [usual("gen_ai.usage.prompt_tokens", -3)],  # ten-byte varint, negative
    [usual("gen_ai.usage.prompt_tokens", 300), usual("gen_ai.request.max_tokens", 70_000)],
    [kv("gen_ai.usage.completion_tokens", bytes([0x10, 0x01]))],  # a boolean count
    [kv("gen_ai.request.id", string("a") + integer(5))],  # AnyValue with two fields
    [kv("gen_ai.response.model", field(7, b"\x00\x01"))],  # bytes
    [kv("gen_ai.response.model", ARRAY.SerializeToString())],  # array
    [kv("gen_ai.latency.e2e", b"")],  # empty AnyValue
    [usual("gen_ai.latency.time_in_queue", -0.0), usual("gen_ai.latency.e2e", 0.0)],
    [usual(LONG_KEY, "t-long"), usual("servewatch.tenant", "")],  # long key
    [KeyValue(key="x.other", value=AnyValue(int_value=1)).SerializeToString()],
    [usual("gen_ai.latency.e2e", 2)],  # an int where a double is expected
    [usual("gen_ai.response.model", "é-model"), usual("error.type", "timeout")],
    [usual("gen_ai.usage.output_tokens", 9.0), usual("gen_ai.usage.input_tokens", 3)],
]


def span(index: int, attributes: list[bytes], *, name: bytes = b"llm_request") -> bytes:
    head = (
        field(1, bytes([index + 1]) * 16)
        + field(2, bytes([index + 1]) * 8)
        + bytes([0x39])
        + struct.pack("<Q", T0_NS + index)
        + bytes([0x41])
        + struct.pack("<Q", T0_NS + index + 10**9)
    )
    encoded = b"".join(field(9, a) for a in attributes)
    status = field(15, bytes([0x18, 0x02])) if index % 3 == 0 else b""
    if index % 2:  # name after the attributes, status given twice
        return head + encoded + field(5, name) + status + field(15, bytes([0x18, 0x00]))
    return head + field(5, name) + status + encoded


def request_body() -> bytes:
    resource = field(1, usual("servewatch.replica", "vllm-3")) + field(
        1, usual("servewatch.pool", "p1")
    )
    spans = [span(i, BASE + odd) for i, odd in enumerate(ODD_ATTRIBUTES)]
    spans.append(span(len(spans), [*BASE, b""], name=b"http"))
    scope = b"".join(field(2, s) for s in spans)
    resource_spans = field(1, resource) + field(2, scope)
    return field(1, resource_spans)


def slow_path(body: bytes, mapping: SpanMapping) -> tuple[RequestRows, list[tuple[str, str]]]:
    rows = RequestRows(mapping=mapping)
    unusable = []
    for decoded in decode_trace_request_bytes(body).spans:
        if rows.is_request(decoded):
            try:
                rows.add(decoded, source="s")
            except SpanMappingError as exc:
                unusable.append((decoded.span_id, str(exc)))
    return rows, unusable


@pytest.mark.parametrize(
    "mapping", [SpanMapping(), SpanMapping(tenant_keys=(LONG_KEY, "servewatch.tenant"))]
)
def test_unusual_encodings_map_as_the_full_decode_does(mapping: SpanMapping) -> None:
    body = request_body()
    expected_rows, expected_unusable = slow_path(body, mapping)
    rows = RequestRows(mapping=mapping)
    mapped = map_request_spans(body, rows, source="s")
    assert rows.to_frame().equals(expected_rows.to_frame())
    assert mapped.unusable == expected_unusable
    assert mapped.spans == len(ODD_ATTRIBUTES) + 1
    assert mapped.request_spans == len(ODD_ATTRIBUTES)
    assert not mapped.errors
    # The cases above are not all rejected or all kept: both paths are compared.
    assert 0 < len(rows) < len(ODD_ATTRIBUTES)
    frame = rows.to_frame()
    assert "r" * 300 in frame["request_id"].to_list()
    assert frame["tenant"].to_list().count("t-long") == (mapping.tenant_keys[0] == LONG_KEY)
