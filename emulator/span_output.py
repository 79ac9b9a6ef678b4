"""Request spans of an emulated fleet: each finished request as vLLM's `llm_request` span.

Spans are the OpenTelemetry SDK's own finished-span objects, handed to an SDK span processor:
in live mode a `BatchSpanProcessor` with the OTLP/HTTP exporter (what vLLM runs with
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`), in fixture mode a synchronous batcher
writing OTLP JSON lines (the Collector file exporter's format). Spans are built directly rather
than through a tracer because fixture mode makes millions of them (about 3 us instead of 40 us
each); attributes, kind, status and times are the tracer path's (see emulator/request_span.py).

Each replica process is one OpenTelemetry resource: `service.name=vllm`, `vllm.process_id`
(new after every restart), `host.name`, and the keys servewatch's ingest reads
(`servewatch.replica`, `servewatch.zone`, `servewatch.pool`), plus `servewatch.emulated=true`.
A tenant, when the workload has one, is a span attribute `servewatch.tenant`, as a gateway in
front of vLLM would add.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable
from typing import IO

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from emulator.otlp_jsonl import OtlpJsonLinesExporter
from emulator.records import (
    EngineSteps,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
)
from emulator.request_span import RequestTiming, request_span

EMULATED_ATTRIBUTE = "servewatch.emulated"
TENANT_ATTRIBUTE = "servewatch.tenant"
SCOPE = InstrumentationScope("vllm.llm_engine")
FIRST_PROCESS_ID = 4096


def replica_resource(placement: ReplicaPlacement, *, process_id: int) -> Resource:
    """The resource of one vLLM process of `placement`, marked as emulated."""
    # Resource(...) rather than Resource.create(...): the latter adds SDK and process details
    # of the emulator itself, which would make fixtures differ from run to run.
    return Resource(
        {
            "service.name": "vllm",
            "servewatch.replica": placement.replica,
            "host.name": placement.host,
            "servewatch.zone": placement.zone,
            "servewatch.pool": placement.pool,
            EMULATED_ATTRIBUTE: True,
            "vllm.process_id": process_id,
        }
    )


def request_timing(record: FinishedRequest, *, model: str) -> RequestTiming:
    """What the span says about `record`; failed requests carry their finished reason as
    `error.type` (and status ERROR), so ingest counts them as failures."""
    return RequestTiming(
        request_id=record.request_id,
        arrival_s=record.arrival_s,
        queue_s=record.queue_s,
        prefill_s=record.prefill_s,
        decode_s=record.decode_s,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        max_tokens=record.max_tokens,
        error_type=record.finished_reason.value if record.failed else None,
        model=model,
    )


class SeededIdGenerator(IdGenerator):
    """Trace and span ids from a seeded generator, so a fixture is reproducible byte for byte."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)  # noqa: S311 (reproducible ids, not secrets)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


class SyncBatchSpanProcessor(SpanProcessor):
    """Hands finished spans to an exporter in batches of `batch_size`, on the caller's thread.

    The SDK's BatchSpanProcessor drops spans when its queue fills under a burst; a fixture
    must keep every span, and virtual time has no reason to wait for a background thread.
    """

    def __init__(self, exporter: SpanExporter, *, batch_size: int = 512) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self._exporter = exporter
        self._batch_size = batch_size
        self._pending: list[ReadableSpan] = []
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self._pending.append(span)
            if len(self._pending) >= self._batch_size:
                self._export_pending()

    def _export_pending(self) -> None:
        if self._pending:
            batch, self._pending = self._pending, []
            self._exporter.export(batch)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            self._export_pending()
        return self._exporter.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.force_flush()
        self._exporter.shutdown()


class SpanOutput:
    """A fleet observer that turns every finished request into an `llm_request` span."""

    def __init__(
        self,
        placements: Iterable[ReplicaPlacement],
        processor: SpanProcessor,
        *,
        id_generator: IdGenerator | None = None,
    ) -> None:
        self.placements = {p.replica: p for p in placements}
        self._processor = processor
        self._ids = id_generator or RandomIdGenerator()
        self._next_process_id = FIRST_PROCESS_ID
        self._resources = {
            replica: self._new_resource(placement) for replica, placement in self.placements.items()
        }
        self.spans_emitted = 0

    def _new_resource(self, placement: ReplicaPlacement) -> Resource:
        process_id = self._next_process_id
        self._next_process_id += 1
        return replica_resource(placement, process_id=process_id)

    def _placement(self, replica: str) -> ReplicaPlacement:
        try:
            return self.placements[replica]
        except KeyError:
            raise KeyError(
                f"record for replica {replica!r}, which has no placement "
                f"(known: {sorted(self.placements)})"
            ) from None

    def request_finished(self, record: FinishedRequest) -> None:
        placement = self._placement(record.replica)
        context = SpanContext(
            trace_id=self._ids.generate_trace_id(),
            span_id=self._ids.generate_span_id(),
            is_remote=False,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        extra: dict[str, AttributeValue] | None = None
        if record.tenant is not None:
            extra = {TENANT_ATTRIBUTE: record.tenant}
        span = request_span(
            request_timing(record, model=placement.model),
            context=context,
            resource=self._resources[record.replica],
            scope=SCOPE,
            extra_attributes=extra,
        )
        self._processor.on_end(span)
        self.spans_emitted += 1

    def engine_steps(self, record: EngineSteps) -> None:
        """Engine steps leave no spans."""

    def replica_event(self, event: ReplicaEvent) -> None:
        if event.kind is ReplicaEventKind.STARTED:
            # A restarted server is a new process: a new vllm.process_id in its resource.
            self._resources[event.replica] = self._new_resource(self._placement(event.replica))

    def flush(self) -> bool:
        return self._processor.force_flush()

    def shutdown(self) -> None:
        self._processor.shutdown()


def jsonl_span_output(
    placements: Iterable[ReplicaPlacement],
    stream: IO[str],
    *,
    seed: int,
    spans_per_line: int = 512,
) -> SpanOutput:
    """Fixture mode: spans as OTLP JSON lines on `stream`, `spans_per_line` per line."""
    processor = SyncBatchSpanProcessor(OtlpJsonLinesExporter(stream), batch_size=spans_per_line)
    return SpanOutput(placements, processor, id_generator=SeededIdGenerator(seed))


def otlp_http_span_output(
    placements: Iterable[ReplicaPlacement],
    *,
    endpoint: str,
    timeout_s: float = 10.0,
    max_queue_size: int = 65536,
    schedule_delay_ms: float = 500.0,
    id_generator: IdGenerator | None = None,
) -> SpanOutput:
    """Live mode: spans sent with the SDK's OTLP/HTTP (protobuf) exporter to `endpoint`
    (the full URL, e.g. http://127.0.0.1:4318/v1/traces).

    The queue is far larger than the SDK's default of 2048, which drops spans under bursts.
    """
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(
            f"OTLP endpoint must be an http:// or https:// URL ending in /v1/traces, "
            f"got {endpoint!r}"
        )
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s)
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=max_queue_size,
        schedule_delay_millis=schedule_delay_ms,
        max_export_batch_size=512,
    )
    return SpanOutput(placements, processor, id_generator=id_generator)
