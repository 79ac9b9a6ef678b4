"""Request spans as vLLM's tracer makes them, finished in memory, for the OTLP receiver tests."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from servewatch.emulator.request_span import RequestTiming, record_request_span


def request_spans(
    resource: Resource, n: int, *, broken: int = 0, id_prefix: str = "cmpl", tracer_name: str
) -> list[ReadableSpan]:
    """`n` request spans of `resource`, a second apart, then `broken` request spans without
    the latencies a request row needs."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(tracer_name)
    for i in range(n):
        timing = RequestTiming(
            request_id=f"{id_prefix}-{i}",
            arrival_s=1_795_000_000.0 + i,
            queue_s=0.01,
            prefill_s=0.1,
            decode_s=0.5,
            prompt_tokens=100,
            completion_tokens=11,
        )
        record_request_span(tracer, timing)
    for i in range(broken):
        tracer.start_span("llm_request", start_time=1_795_000_000 * 10**9 + i).end()
    return list(memory.get_finished_spans())
