"""The compiled OTLP decoder against the reference path: on the fuzz corpus and on generated
bodies, `map_request_spans` gives the same request rows (bit for bit), the same counts, the same
refusals and the same unusable spans with it as without it; and it takes the plain bodies SDKs
send, so the comparison is not of the reference with itself."""

from __future__ import annotations

import os
import random
import struct
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from bench.otlp_receive import export_body
from servewatch.collectors.traces import otlp_native
from servewatch.collectors.traces.otlp_protobuf import (
    OtlpProtobufError,
    map_request_spans,
    map_request_spans_reference,
)
from servewatch.collectors.traces.request_spans import (
    LATENCY_KEYS,
    RequestRows,
    SpanMapping,
)
from servewatch.collectors.traces.span_identity import TargetDirectory, TargetLabels
from tests.test_otlp_fuzz import mutate_bytes, mutate_message, seeds
from tests.test_otlp_protobuf_encodings import request_body as odd_encodings_body
from tests.test_otlp_protobuf_mapping import request_body as variants_body
from tests.test_otlp_receiver import make_spans

MAPPINGS = [
    SpanMapping(),
    SpanMapping(tenant_keys=("tenant.id",), pool_keys=("x",), default_model="base"),
]
TARGETS = TargetDirectory.of(
    [TargetLabels(replica="vllm-3", host="h3", zone="z1", pool="p", model="llama-3-8b")]
)
FLOAT_COLUMNS = [*LATENCY_KEYS]


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    try:
        otlp_native.build()
    except otlp_native.OtlpNativeBuildError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the C decoder does not build here: {exc}")
    if not otlp_native.reload().active:
        pytest.skip(f"the C decoder is off: {otlp_native.status().reason}")


def _outcome(mapper: Any, body: bytes, mapping: SpanMapping) -> tuple[object, ...]:
    rows = RequestRows(mapping=mapping, targets=TARGETS)
    try:
        mapped = mapper(body, rows, source="src")
    except OtlpProtobufError as exc:
        return ("refused", str(exc))
    frame = rows.to_frame()
    # Frame equality takes -0.0 for 0.0: compare the floats' bits as well.
    bits = [
        [None if v is None else struct.pack("<d", v) for v in frame[column].to_list()]
        for column in FLOAT_COLUMNS
    ]
    errors = [(e.path, e.message) for e in mapped.errors]
    return (frame, bits, mapped.spans, mapped.request_spans, errors, mapped.unusable)


def assert_same(body: bytes, mapping: SpanMapping = MAPPINGS[0]) -> bool:
    """The two paths agree on `body`; returns whether the compiled decoder took it."""
    expected = _outcome(map_request_spans_reference, body, mapping)
    found = _outcome(map_request_spans, body, mapping)
    if not isinstance(expected[0], pl.DataFrame) or not isinstance(found[0], pl.DataFrame):
        assert found == expected
    else:
        assert found[0].schema == expected[0].schema
        assert found[0].equals(expected[0]), (found[0], expected[0])
        assert found[1:] == expected[1:]
    return otlp_native.decode(body, mapping) is not None


def vllm_body(seed: int, spans: int = 40) -> bytes:
    """A body as vLLM's SDK sends it (the benchmark's generator)."""
    body, _ = export_body(random.Random(seed), seed * 1000, spans, 1_795_000_000 * 10**9)
    return body


def test_sdk_bodies_take_the_compiled_path_with_the_same_rows() -> None:
    for seed in range(5):
        for mapping in MAPPINGS:
            assert assert_same(vllm_body(seed), mapping)
    # The OpenTelemetry SDK's own encoding (empty status, flags), as vLLM sends it.
    assert assert_same(encode_spans(make_spans(6)).SerializeToString())
    broken = encode_spans(make_spans(6, broken=1)).SerializeToString()
    assert not assert_same(broken)  # the broken span is the reference's to refuse


def test_bodies_with_refused_or_unusual_spans_map_as_the_reference_does() -> None:
    for body in (variants_body(), odd_encodings_body()):
        for mapping in MAPPINGS:
            assert not assert_same(body, mapping)  # each holds a span the reference refuses


@pytest.mark.parametrize("seed", range(3))
def test_fuzz_corpus_maps_as_the_reference_does(seed: int) -> None:
    rng = random.Random(1000 + seed)
    requests = [*seeds(), ExportTraceServiceRequest.FromString(vllm_body(seed, 8))]
    bodies = [r.SerializeToString() for r in requests]
    taken = 0
    for _ in range(400):
        index = rng.randrange(len(bodies))
        taken += assert_same(mutate_bytes(rng, bodies[index], bodies[index - 1]))
        taken += assert_same(mutate_message(rng, requests[index]), rng.choice(MAPPINGS))
    assert taken > 0


KEYS = [
    *LATENCY_KEYS.values(),
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.completion_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.request.max_tokens",
    "gen_ai.request.id",
    "error.type",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "servewatch.replica",
    "servewatch.tenant",
    "tenant.id",
    "session.id",
    "servewatch.adapter",
    "x",
    "other.key",
]
VALUES = st.one_of(
    st.floats(min_value=0.0, max_value=10.0),
    st.sampled_from([-0.0, -1.0, float("nan"), float("inf"), 1e308]),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=0, max_value=5000),
    st.text(max_size=6),
    st.sampled_from(["", "vllm-3", "llama-3-8b", "lora-a", "t1"]),
    st.booleans(),
    st.none(),
)
ATTRIBUTES = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=14)
BASE = {
    "gen_ai.latency.time_to_first_token": 0.25,
    "gen_ai.latency.e2e": 1.5,
    "gen_ai.usage.completion_tokens": 40,
}


def _set(kv: KeyValue, value: object) -> None:
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    elif isinstance(value, str):
        kv.value.string_value = value
    # None: a key without a value


SPANS = st.lists(
    st.tuples(
        st.one_of(st.just(BASE), st.builds(lambda a: {**BASE, **a}, ATTRIBUTES), ATTRIBUTES),
        st.sampled_from(["llm_request", "llm_request", "http"]),
        st.sampled_from([0, 0, 1, 2]),
        st.sampled_from([(5, 10**9), (10**9, 5), (0, 5), (1, 2**63), (1, 1)]),
        st.integers(min_value=0, max_value=3),
    ),
    min_size=0,
    max_size=8,
)
RESOURCES = st.lists(
    st.tuples(
        st.dictionaries(
            st.sampled_from(["servewatch.replica", "host.name", "servewatch.emulated", "a"]),
            st.sampled_from(["vllm-3", "vllm-9", "h", True]),
            max_size=3,
        ),
        SPANS,
    ),
    min_size=0,
    max_size=3,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resources=RESOURCES, mapping=st.sampled_from(MAPPINGS))
def test_generated_bodies_map_as_the_reference_does(
    resources: list[tuple[dict[str, object], list[Any]]], mapping: SpanMapping
) -> None:
    request = ExportTraceServiceRequest()
    for number, (resource, spans) in enumerate(resources):
        resource_spans = request.resource_spans.add()
        for key, value in resource.items():
            _set(resource_spans.resource.attributes.add(key=key), value)
        scope = resource_spans.scope_spans.add()
        for index, (attributes, name, status, (start, end), id_of) in enumerate(spans):
            span = scope.spans.add(name=name, start_time_unix_nano=start, end_time_unix_nano=end)
            # a repeated span id now and then: the export's own duplicates are dropped
            span.trace_id = bytes([number, index % 4 if id_of == 3 else index]) * 8
            span.span_id = bytes([number, id_of if id_of == 3 else index]) * 4
            span.status.code = status  # type: ignore[assignment]
            for key, value in attributes.items():
                _set(span.attributes.add(key=key), value)
    assert_same(request.SerializeToString(), mapping)
