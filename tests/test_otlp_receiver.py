"""The OTLP/HTTP receiver: status codes and partial success by table, then real SDK exports."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from servewatch.collectors.fixture.recording import otlp_json_line
from servewatch.collectors.store_writer import StoreWriter
from servewatch.collectors.traces.receiver import (
    ExportOutcome,
    OtlpHttpReceiver,
    ReceiverConfig,
    handle_export,
)
from servewatch.emulator.otlp_jsonl import spans_to_otlp_json
from servewatch.store import Store
from tests.request_span_builder import request_spans

NOW = datetime(2026, 11, 29, 12, 0, 0)
TOKEN = "s3cret"


def make_spans(n: int, *, replica: str = "vllm-7", broken: int = 0) -> list[ReadableSpan]:
    resource = Resource({"service.name": "vllm", "servewatch.replica": replica})
    return request_spans(resource, n, broken=broken, tracer_name="vllm")


def protobuf_body(spans: list[ReadableSpan]) -> bytes:
    return encode_spans(spans).SerializeToString()


def export(body: bytes, **overrides: str | None) -> ExportOutcome:
    headers: dict[str, str | None] = {
        "content_type": "application/x-protobuf",
        "content_encoding": "",
        "authorization": None,
    } | overrides
    return handle_export(
        body,
        content_type=headers["content_type"] or "",
        content_encoding=headers["content_encoding"] or "",
        authorization=headers["authorization"],
        config=ReceiverConfig(max_body_bytes=200_000),
        received_ts=NOW,
    )


BODY = protobuf_body(make_spans(3))


@pytest.mark.parametrize(
    ("body", "headers", "status", "message"),
    [
        (b"\xff\xff\xff", {}, 400, "not a protobuf ExportTraceServiceRequest"),
        (BODY, {"content_encoding": "gzip"}, 400, "not valid gzip"),
        (b"{nope", {"content_type": "application/json"}, 400, "not valid JSON"),
        (b"[1, 2]", {"content_type": "application/json"}, 400, "expected a JSON object"),
        (BODY, {"content_type": "text/plain"}, 415, "content type 'text/plain'"),
        (BODY, {"content_encoding": "br"}, 415, "content encoding 'br'"),
        (b"x" * 200_001, {}, 413, "exceeds the limit"),
        (gzip.compress(b"\0" * 300_000), {"content_encoding": "gzip"}, 413, "decompressed"),
    ],
)
def test_refused_requests(body: bytes, headers: dict[str, str], status: int, message: str) -> None:
    outcome = export(body, **headers)
    assert outcome.status == status
    assert message in json.loads(outcome.body)["message"]
    assert outcome.rows is None


def test_bearer_token() -> None:
    config = ReceiverConfig(bearer_token=TOKEN)
    for auth in (None, "Bearer wrong", TOKEN):
        refused = handle_export(
            BODY,
            content_type="application/x-protobuf",
            content_encoding="",
            authorization=auth,
            config=config,
        )
        assert refused.status == 401
    accepted = handle_export(
        BODY,
        content_type="application/x-protobuf",
        content_encoding="",
        authorization=f"Bearer {TOKEN}",
        config=config,
    )
    assert accepted.status == 200


def test_partial_success_reports_broken_spans_and_keeps_the_rest() -> None:
    outcome = export(gzip.compress(protobuf_body(make_spans(4, broken=2))), content_encoding="gzip")
    assert outcome.status == 200
    response = ExportTraceServiceResponse.FromString(outcome.body)
    assert response.partial_success.rejected_spans == 2
    assert "missing attribute gen_ai.latency.time_to_first_token" in (
        response.partial_success.error_message
    )
    assert outcome.rows is not None
    assert outcome.rows.height == 4


def test_json_bodies_get_json_answers() -> None:
    body = spans_to_otlp_json(make_spans(2, broken=1)).encode()
    outcome = export(body, content_type="application/json")
    assert outcome.status == 200
    assert json.loads(outcome.body)["partialSuccess"]["rejectedSpans"] == "1"
    assert outcome.rows is not None
    assert outcome.rows.height == 2


def with_poisoned_span(poison: Callable[[Span], None], *, good: int = 3) -> bytes:
    """A protobuf export of `good` request spans and one more (span id ee..) made bad by
    `poison`."""
    request: ExportTraceServiceRequest = encode_spans(make_spans(good))
    spans = request.resource_spans[0].scope_spans[0].spans
    bad = spans.add()
    bad.CopyFrom(spans[0])
    bad.span_id = b"\xee" * 8
    poison(bad)
    return request.SerializeToString()


def setting(key: str, value: float) -> Callable[[Span], None]:
    def poison(span: Span) -> None:
        (entry,) = [kv for kv in span.attributes if kv.key == key]
        entry.value.double_value = value

    return poison


def ending_at(end_ns: int) -> Callable[[Span], None]:
    def poison(span: Span) -> None:
        span.end_time_unix_nano = end_ns

    return poison


TTFT, E2E = "gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e"
POISONS = {
    "end at 2^63 ns": (ending_at(2**63), "below 2^63"),
    "end at 2^64-1 ns": (ending_at(2**64 - 1), "below 2^63"),
    "NaN TTFT": (setting(TTFT, math.nan), f"attribute {TTFT} must be a finite number"),
    "+Inf e2e": (setting(E2E, math.inf), f"attribute {E2E} must be a finite number"),
    "Inf queue": (setting("gen_ai.latency.time_in_queue", math.inf), "must be a finite"),
    "negative decode": (setting("gen_ai.latency.time_in_model_decode", -0.5), "is negative"),
    "TTFT over e2e": (setting(TTFT, 1e3), f"{TTFT} (1000.0) exceeds {E2E}"),
}


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("poison", sorted(POISONS))
def test_a_poisoned_span_is_rejected_alone_and_the_good_spans_are_kept(
    poison: str, encoding: str
) -> None:
    mutate, reason = POISONS[poison]
    body = with_poisoned_span(mutate)
    if encoding == "json":
        body = otlp_json_line(body, protobuf=True)
    outcome = export(body, content_type=f"application/{'x-' * (encoding == 'protobuf')}{encoding}")
    assert outcome.status == 200
    assert outcome.rows is not None
    assert outcome.rows.height == 3
    assert "ee" * 8 not in outcome.rows["span_id"].to_list()
    assert all(math.isfinite(v) for v in outcome.rows["ttft_s"].to_list())
    ((reject),) = outcome.rejects
    assert reject.location.endswith(f"span {'ee' * 8}")
    assert reason in reject.message


def test_json_values_past_int64_reject_their_span_only() -> None:
    doc = json.loads(otlp_json_line(protobuf_body(make_spans(4)), protobuf=True))
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["startTimeUnixNano"] = "-5"
    spans[1]["endTimeUnixNano"] = str(10**30)
    (tokens,) = [a for a in spans[2]["attributes"] if a["key"].endswith("completion_tokens")]
    tokens["value"] = {"intValue": str(2**63)}
    (e2e,) = [a for a in spans[3]["attributes"] if a["key"] == E2E]
    e2e["value"] = {"intValue": str(10**400)}
    outcome = export(json.dumps(doc).encode(), content_type="application/json")
    assert outcome.status == 200
    assert outcome.rows is not None
    assert outcome.rows.height == 0
    messages = [r.message for r in outcome.rejects]
    assert "below 2^63" in messages[0]
    assert "below 2^63" in messages[1]
    assert "too large for a count" in messages[2]
    assert f"attribute {E2E} must be a finite number" in messages[3]


@pytest.fixture
def receiver_and_store() -> Iterator[tuple[OtlpHttpReceiver, StoreWriter, Store]]:
    with Store.open(":memory:") as store, StoreWriter(store) as writer:
        receiver = OtlpHttpReceiver(ReceiverConfig(port=0, bearer_token=TOKEN), writer)
        receiver.start()
        try:
            yield receiver, writer, store
        finally:
            receiver.stop()


def test_real_sdk_exporter_over_http_with_gzip_and_dedup(
    receiver_and_store: tuple[OtlpHttpReceiver, StoreWriter, Store],
) -> None:
    receiver, writer, store = receiver_and_store
    assert receiver.endpoint.startswith("http://127.0.0.1:")
    exporter = OTLPSpanExporter(
        endpoint=receiver.endpoint,
        headers={"Authorization": f"Bearer {TOKEN}"},
        compression=Compression.Gzip,
        timeout=10,
    )
    spans = make_spans(50)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # a retry: deduplicated
    writer.flush()
    rows = store.read_requests().collect()
    assert rows.height == 50
    assert set(rows["replica"]) == {"vllm-7"}
    assert rows["tpot_s" if "tpot_s" in rows.columns else "decode_s"].to_list()[0] == pytest.approx(
        0.5
    )
    assert writer.counters.failed_tasks == 0
    exporter.shutdown()


def test_wrong_token_is_refused_over_http(
    receiver_and_store: tuple[OtlpHttpReceiver, StoreWriter, Store],
) -> None:
    receiver, writer, store = receiver_and_store
    exporter = OTLPSpanExporter(endpoint=receiver.endpoint, timeout=5)
    assert exporter.export(make_spans(1)) == SpanExportResult.FAILURE
    writer.flush()
    assert store.count("requests") == 0
    exporter.shutdown()
