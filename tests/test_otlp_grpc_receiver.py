"""The OTLP/gRPC receiver, fed by the OpenTelemetry SDK's own gRPC exporter as vLLM exports.

vLLM's tracer is an SDK `TracerProvider` whose resource `Resource.create` fills with a random
`service.instance.id`; its resource names `vllm.process_id`, and a Kubernetes deployment adds
`k8s.pod.name` through OTEL_RESOURCE_ATTRIBUTES. Its V1 `llm_request` span names no model.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import polars as pl
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.scrape.targets import Target, TargetKind
from servewatch.collectors.store_writer import StoreWriter
from servewatch.collectors.traces.grpc_receiver import METHOD, SERVICE, OtlpGrpcReceiver
from servewatch.collectors.traces.receiver import ReceiverConfig
from servewatch.collectors.traces.span_identity import TargetDirectory
from servewatch.service import Service
from servewatch.store import Store
from tests.conftest import free_port
from tests.request_span_builder import request_spans
from tests.test_otlp_receiver import protobuf_body

TOKEN = "grpc-s3cret"
POD = "vllm-llama-7d9f-x2k4p"
BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TARGET = Target(
    target_id="http://10.0.0.5:8000/metrics",
    kind=TargetKind.VLLM,
    url="http://10.0.0.5:8000/metrics",
    replica=POD,
    host="gpu-node-1",
    zone="zone-a",
    model=BASE_MODEL,
    pool="chat",
)


def vllm_spans(
    n: int, *, pod: str | None = POD, broken: int = 0, extra: dict[str, str] | None = None
) -> list[ReadableSpan]:
    """`n` request spans as vLLM V1 makes them, from a resource as vLLM's tracer builds it."""
    attributes = {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": "4711"}
    if pod is not None:
        attributes["k8s.pod.name"] = pod
    resource = Resource.create(attributes | {"service.name": "vllm"})
    assert resource.attributes["service.instance.id"]  # the SDK's random UUID
    spans = request_spans(
        resource, n, broken=broken, id_prefix="chatcmpl", tracer_name="vllm.llm_engine"
    )
    if extra:
        spans = [_with_attributes(span, extra) for span in spans]
    return spans


def _with_attributes(span: ReadableSpan, extra: dict[str, str]) -> ReadableSpan:
    return ReadableSpan(
        name=span.name,
        context=span.context,
        resource=span.resource,
        attributes={**(span.attributes or {}), **extra},
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def exporter(port: int, *, token: str | None = TOKEN, timeout_s: float = 10) -> OTLPSpanExporter:
    headers = {"authorization": f"Bearer {token}"} if token else None
    return OTLPSpanExporter(
        endpoint=f"http://127.0.0.1:{port}", insecure=True, headers=headers, timeout=timeout_s
    )


@contextmanager
def grpc_receiver(
    *, targets: tuple[Target, ...] = (TARGET,), **config: object
) -> Iterator[tuple[OtlpGrpcReceiver, StoreWriter, Store]]:
    settings = ReceiverConfig(**({"grpc_port": 0, "bearer_token": TOKEN} | config))  # type: ignore[arg-type]
    directory = TargetDirectory.from_targets(targets)
    with Store.open(":memory:") as store, StoreWriter(store, linger_s=0.01) as writer:
        receiver = OtlpGrpcReceiver(settings, writer, targets=lambda: directory)
        receiver.start()
        try:
            yield receiver, writer, store
        finally:
            receiver.stop()


def stored(writer: StoreWriter) -> pl.DataFrame:
    seen: list[pl.DataFrame] = []
    writer.submit_task(lambda s: seen.append(s.read_requests().collect()))
    writer.flush()
    return seen[0]


def raw_export(port: int, body: bytes, *, token: str | None = TOKEN) -> bytes:
    """One Export call with `body` as its bytes, as any gRPC client sends it."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
        metadata = [("authorization", f"Bearer {token}")] if token else None
        answer: bytes = call(body, metadata=metadata, timeout=10)
        return answer


def test_vllm_spans_from_the_grpc_exporter_land_under_the_pod_and_join_its_target() -> None:
    with grpc_receiver() as (receiver, writer, _store):
        sdk = exporter(receiver.port)
        try:
            assert sdk.export(vllm_spans(3)) is SpanExportResult.SUCCESS
        finally:
            sdk.shutdown()
        rows = stored(writer)
    assert rows.height == 3
    # Not the SDK's random service.instance.id: the pod, which is what the target is labelled.
    assert set(rows["replica"]) == {POD}
    assert set(rows["source"]) == {"otlp-grpc"}
    joined = rows.join(
        pl.DataFrame({"replica": [POD], "target_id": [TARGET.target_id]}), on="replica"
    )
    assert joined.height == 3
    # The span names no model or pool: they are the target's.
    assert set(rows["model"]) == {BASE_MODEL}
    assert set(rows["pool"]) == {"chat"}
    assert set(rows["host"]) == {"gpu-node-1"}
    assert rows["adapter"].null_count() == 3


def test_a_model_other_than_the_base_is_the_requests_adapter() -> None:
    with grpc_receiver() as (receiver, writer, _store):
        sdk = exporter(receiver.port)
        try:
            spans = vllm_spans(2, extra={"gen_ai.request.model": "sql-lora"})
            assert sdk.export(spans) is SpanExportResult.SUCCESS
        finally:
            sdk.shutdown()
        rows = stored(writer)
    assert rows.select("model", "adapter").unique().rows() == [("sql-lora", "sql-lora")]


@pytest.mark.parametrize(
    ("token", "code"),
    [(None, grpc.StatusCode.UNAUTHENTICATED), ("wrong", grpc.StatusCode.UNAUTHENTICATED)],
)
def test_an_export_without_the_token_is_refused(token: str | None, code: grpc.StatusCode) -> None:
    with grpc_receiver() as (receiver, writer, _store):
        with pytest.raises(grpc.RpcError) as refused:
            raw_export(receiver.port, protobuf_body(vllm_spans(2)), token=token)
        assert refused.value.code() == code
        assert "missing or wrong bearer token" in refused.value.details()
        sdk = exporter(receiver.port, token=token)
        try:
            assert sdk.export(vllm_spans(1)) is SpanExportResult.FAILURE  # not retried
        finally:
            sdk.shutdown()
        assert stored(writer).height == 0


def test_an_oversize_export_is_refused_and_stores_nothing() -> None:
    body = protobuf_body(vllm_spans(40))
    with grpc_receiver(max_body_bytes=len(body) - 1) as (receiver, writer, _store):
        with pytest.raises(grpc.RpcError) as refused:
            raw_export(receiver.port, body)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Compressed under the limit, over it once gRPC has inflated it.
        with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
            with pytest.raises(grpc.RpcError) as inflated:
                call(
                    body,
                    metadata=[("authorization", f"Bearer {TOKEN}")],
                    compression=grpc.Compression.Gzip,
                    timeout=10,
                )
        assert len(gzip.compress(body)) < len(body) - 1
        assert inflated.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raw_export(receiver.port, protobuf_body(vllm_spans(1))) == b""
        assert stored(writer).height == 1


def test_a_malformed_span_is_rejected_in_partial_success_and_the_rest_kept() -> None:
    with grpc_receiver() as (receiver, writer, store):
        answer = raw_export(receiver.port, protobuf_body(vllm_spans(3, broken=2)))
        response = ExportTraceServiceResponse.FromString(answer)
        assert response.partial_success.rejected_spans == 2
        assert "missing attribute gen_ai.latency.time_to_first_token" in (
            response.partial_success.error_message
        )
        assert stored(writer).height == 3
        with pytest.raises(grpc.RpcError) as undecodable:
            raw_export(receiver.port, b"\xff\xff\xff")
        assert undecodable.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        writer.flush()
        errors = store.read_ingest_errors().collect()
    assert set(errors["source"]) == {"otlp-grpc"}
    assert errors.height == 2


def test_an_export_is_answered_only_once_its_spans_are_committed() -> None:
    gate = threading.Event()
    with grpc_receiver() as (receiver, writer, _store):
        writer.submit_task(lambda s: gate.wait())  # the writer is busy: nothing commits
        with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
            future = call.future(
                protobuf_body(vllm_spans(3)),
                metadata=[("authorization", f"Bearer {TOKEN}")],
                timeout=20,
            )
            try:
                with pytest.raises(grpc.FutureTimeoutError):
                    future.result(timeout=0.5)  # no answer while the spans are only queued
            finally:
                gate.set()
            assert future.result(timeout=20) == b""
            rows_when_answered = stored(writer).height
    assert rows_when_answered == 3


def test_uncommitted_spans_are_answered_unavailable() -> None:
    with Store.open(":memory:") as store:
        writer = StoreWriter(store)
        receiver = OtlpGrpcReceiver(ReceiverConfig(grpc_port=0), writer)
        receiver.start()
        try:
            writer.close()
            with pytest.raises(grpc.RpcError) as refused:
                raw_export(receiver.port, protobuf_body(vllm_spans(1)), token=None)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert store.count("requests") == 0
        finally:
            receiver.stop()


def test_a_grpc_port_in_use_is_named(tmp_path: Path, runner: CliRunner) -> None:
    with grpc_receiver() as (receiver, _writer, _store):
        taken = receiver.port
        with pytest.raises(
            OSError, match=rf"OTLP/gRPC on 127\.0\.0\.1:{taken}: the port is in use"
        ):
            OtlpGrpcReceiver(ReceiverConfig(grpc_port=taken), _writer)
        config = tmp_path / "servewatch.toml"
        config.write_text(
            f'[store]\npath = "{tmp_path / "s.duckdb"}"\n[otlp]\nlisten = "127.0.0.1:0"\n'
            f'grpc_listen = "127.0.0.1:{taken}"\n',
            encoding="utf-8",
        )
        with pytest.raises(OSError, match=f"127.0.0.1:{taken}"):
            Service(config)
        # The store the failed start opened is closed again: another can open it.
        with Store.open(tmp_path / "s.duckdb"):
            pass
        result = runner.invoke(app, ["run", "--config", str(config)])
        assert result.exit_code == 1
        assert f"cannot start: cannot listen for OTLP/gRPC on 127.0.0.1:{taken}" in " ".join(
            result.stderr.split()
        )


def test_servewatch_run_receives_grpc_and_matches_its_configured_target(tmp_path: Path) -> None:
    config = tmp_path / "servewatch.toml"
    db = tmp_path / "s.duckdb"
    config.write_text(
        f'[store]\npath = "{db}"\n[otlp]\nlisten = "127.0.0.1:0"\ngrpc_listen = "127.0.0.1:0"\n'
        f'bearer_token = "{TOKEN}"\n'
        f'[[targets]]\nkind = "vllm"\nurl = "http://127.0.0.1:{free_port()}/metrics"\n'
        f'replica = "{POD}"\nmodel = "{BASE_MODEL}"\npool = "chat"\n',
        encoding="utf-8",
    )
    service = Service(config)
    try:
        service.start(health_port=free_port())
        assert service.grpc_receiver is not None
        sdk = exporter(service.grpc_receiver.port)
        try:
            assert sdk.export(vllm_spans(2)) is SpanExportResult.SUCCESS
        finally:
            sdk.shutdown()
    finally:
        service.stop()
    with Store.open(db, read_only=True) as store:
        rows = store.read_requests().collect()
    assert rows.select("replica", "model", "pool").unique().rows() == [(POD, BASE_MODEL, "chat")]


def test_the_exporter_reads_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables docs/traces.md tells vLLM's operators to set, with the exporter made as
    vLLM makes it (`OTLPSpanExporter(endpoint=...)`)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", f"authorization=Bearer%20{TOKEN}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
    with grpc_receiver() as (receiver, writer, _store):
        for endpoint in (f"http://127.0.0.1:{receiver.port}", f"127.0.0.1:{receiver.port}"):
            sdk = OTLPSpanExporter(endpoint=endpoint)
            try:
                assert sdk.export(vllm_spans(1)) is SpanExportResult.SUCCESS
            finally:
                sdk.shutdown()
        assert stored(writer).height == 2


def test_exports_beyond_the_bound_are_refused_at_once() -> None:
    gate = threading.Event()
    with grpc_receiver(max_connections=1) as (receiver, writer, _store):
        writer.submit_task(lambda s: gate.wait())  # the one export in progress waits
        with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
            metadata = [("authorization", f"Bearer {TOKEN}")]
            first = call.future(protobuf_body(vllm_spans(1)), metadata=metadata, timeout=20)
            try:
                with pytest.raises(grpc.FutureTimeoutError):
                    first.result(timeout=0.5)
                with pytest.raises(grpc.RpcError) as refused:
                    call(protobuf_body(vllm_spans(1)), metadata=metadata, timeout=5)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            finally:
                gate.set()
            assert first.result(timeout=20) == b""
