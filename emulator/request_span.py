"""The vLLM `llm_request` span: one SERVER span per finished request, as vLLM's tracing emits.

Attribute names and units (seconds, tokens) are vLLM's; start time is the request's arrival.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

SPAN_NAME = "llm_request"
NS_PER_S = 1_000_000_000


@dataclass(frozen=True)
class RequestTiming:
    """What the engine knows about a finished request; times in seconds since the epoch."""

    request_id: str
    arrival_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    completion_tokens: int
    max_tokens: int | None = None
    temperature: float | None = None
    error_type: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s

    @property
    def inference_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def e2e_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s


def record_request_span(tracer: Tracer, timing: RequestTiming) -> None:
    """Start and end one `llm_request` span carrying vLLM's attributes for `timing`."""
    start_ns = round(timing.arrival_s * NS_PER_S)
    span = tracer.start_span(SPAN_NAME, kind=SpanKind.SERVER, start_time=start_ns)
    span.set_attribute("gen_ai.request.id", timing.request_id)
    span.set_attribute("gen_ai.usage.prompt_tokens", timing.prompt_tokens)
    span.set_attribute("gen_ai.usage.completion_tokens", timing.completion_tokens)
    span.set_attribute("gen_ai.latency.time_in_queue", timing.queue_s)
    span.set_attribute("gen_ai.latency.time_to_first_token", timing.ttft_s)
    span.set_attribute("gen_ai.latency.e2e", timing.e2e_s)
    span.set_attribute("gen_ai.latency.time_in_model_prefill", timing.prefill_s)
    span.set_attribute("gen_ai.latency.time_in_model_decode", timing.decode_s)
    span.set_attribute("gen_ai.latency.time_in_model_inference", timing.inference_s)
    if timing.max_tokens is not None:
        span.set_attribute("gen_ai.request.max_tokens", timing.max_tokens)
    if timing.temperature:
        span.set_attribute("gen_ai.request.temperature", timing.temperature)
    if timing.error_type is not None:
        span.set_attribute("error.type", timing.error_type)
        span.set_status(Status(StatusCode.ERROR, timing.error_type))
    span.end(end_time=start_ns + round(timing.e2e_s * NS_PER_S))
