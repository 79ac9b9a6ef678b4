"""The vLLM `llm_request` span: one SERVER span per finished request, as vLLM's tracing emits.

Attribute names and units (seconds, tokens) are vLLM's; start time is the request's arrival.
A span is made either through a tracer (`record_request_span`) or, where millions are needed,
directly as the SDK's finished-span type (`request_span`, about ten times cheaper); both carry
the same attributes, kind, status and times.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

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
    model: str | None = None  # the served model name (`gen_ai.response.model`)

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s

    @property
    def inference_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def e2e_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s


def request_attributes(timing: RequestTiming) -> dict[str, AttributeValue]:
    """The span attributes vLLM sets for `timing`, in vLLM's order."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.request.id": timing.request_id,
        "gen_ai.usage.prompt_tokens": timing.prompt_tokens,
        "gen_ai.usage.completion_tokens": timing.completion_tokens,
        "gen_ai.latency.time_in_queue": timing.queue_s,
        "gen_ai.latency.time_to_first_token": timing.ttft_s,
        "gen_ai.latency.e2e": timing.e2e_s,
        "gen_ai.latency.time_in_model_prefill": timing.prefill_s,
        "gen_ai.latency.time_in_model_decode": timing.decode_s,
        "gen_ai.latency.time_in_model_inference": timing.inference_s,
    }
    if timing.model is not None:
        attributes["gen_ai.response.model"] = timing.model
    if timing.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = timing.max_tokens
    if timing.temperature:
        attributes["gen_ai.request.temperature"] = timing.temperature
    if timing.error_type is not None:
        attributes["error.type"] = timing.error_type
    return attributes


def _status(timing: RequestTiming) -> Status:
    if timing.error_type is None:
        return Status(StatusCode.UNSET)
    return Status(StatusCode.ERROR, timing.error_type)


def _times_ns(timing: RequestTiming) -> tuple[int, int]:
    start_ns = round(timing.arrival_s * NS_PER_S)
    return start_ns, start_ns + round(timing.e2e_s * NS_PER_S)


def record_request_span(tracer: Tracer, timing: RequestTiming) -> None:
    """Start and end one `llm_request` span carrying vLLM's attributes for `timing`."""
    start_ns, end_ns = _times_ns(timing)
    span = tracer.start_span(
        SPAN_NAME, kind=SpanKind.SERVER, start_time=start_ns, attributes=request_attributes(timing)
    )
    if timing.error_type is not None:
        span.set_status(_status(timing))
    span.end(end_time=end_ns)


def request_span(
    timing: RequestTiming,
    *,
    context: SpanContext,
    resource: Resource,
    scope: InstrumentationScope,
    extra_attributes: dict[str, AttributeValue] | None = None,
) -> ReadableSpan:
    """The finished `llm_request` span for `timing`, built directly (no tracer, no sampler).

    `extra_attributes` are what a gateway in front of vLLM adds (a tenant, say); they follow
    vLLM's own attributes.
    """
    start_ns, end_ns = _times_ns(timing)
    attributes = request_attributes(timing)
    if extra_attributes:
        attributes.update(extra_attributes)
    return ReadableSpan(
        name=SPAN_NAME,
        context=context,
        resource=resource,
        attributes=attributes,
        kind=SpanKind.SERVER,
        status=_status(timing),
        start_time=start_ns,
        end_time=end_ns,
        instrumentation_scope=scope,
    )
