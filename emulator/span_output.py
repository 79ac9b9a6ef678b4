"""Request spans of an emulated fleet: each finished request as vLLM's `llm_request` span.

Spans are the OpenTelemetry SDK's own finished-span objects, handed to an SDK span processor:
in live mode a `BatchSpanProcessor` with the OTLP/HTTP exporter (what vLLM runs with
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`), in fixture mode a synchronous batcher
writing OTLP JSON lines (the Collector file exporter's format). Spans are built directly rather
than through a tracer because fixture mode makes millions of them (about 3 us instead of 40 us
each); attributes, kind, status and times are the tracer path's (see emulator/request_span.py).

Each replica process is one OpenTelemetry resource: `service.name=vllm`, `vllm.process_id`
(new after every restart), `host.name`, and the keys servewatch's ingest reads
(`servewatch.replica`, or for a pod `k8s.pod.name` and `k8s.namespace.name`;
`servewatch.zone`, `servewatch.pool`), plus `servewatch.emulated=true`.
A tenant, when the workload has one, is a span attribute `servewatch.tenant`, as a gateway in
front of vLLM would add; so is the conversation (`gen_ai.conversation.id`), when the fleet's
gateway is set to name it (`conversation_ids`).

Size: over 500 lines on purpose: the SDK path and the fast JSON-lines path must emit the same
spans, and the tests compare them side by side.
"""

from __future__ import annotations

import operator
import random
import threading
from collections.abc import Iterable
from typing import Protocol

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from servewatch.emulator.otlp_jsonl import (
    export_line,
    json_string,
    key_prefix,
    resource_spans_parts,
    spans_to_otlp_json,
)
from servewatch.emulator.records import (
    EngineSteps,
    FinishedReason,
    FinishedRequest,
    ReplicaEvent,
    ReplicaEventKind,
    ReplicaPlacement,
)
from servewatch.emulator.request_span import NS_PER_S, SPAN_NAME, RequestTiming, request_span

EMULATED_ATTRIBUTE = "servewatch.emulated"
TENANT_ATTRIBUTE = "servewatch.tenant"
CONVERSATION_ATTRIBUTE = "gen_ai.conversation.id"
SCOPE = InstrumentationScope("vllm.llm_engine")
FIRST_PROCESS_ID = 4096


def replica_resource(placement: ReplicaPlacement, *, process_id: int) -> Resource:
    """The resource of one vLLM process of `placement`, marked as emulated."""
    # Resource(...) rather than Resource.create(...): the latter adds SDK and process details
    # of the emulator itself, which would make fixtures differ from run to run.
    # A replica that is a Kubernetes pod says so as the downward API lets a pod say it; its
    # scrape target names it `<namespace>/<pod>`.
    identity: dict[str, str] = (
        {"servewatch.replica": placement.replica}
        if placement.namespace is None
        else {"k8s.pod.name": placement.replica, "k8s.namespace.name": placement.namespace}
    )
    return Resource(
        {
            "service.name": "vllm",
            **identity,
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
        self.rng = random.Random(seed)  # noqa: S311 (reproducible ids, not secrets)

    def generate_span_id(self) -> int:
        return self.rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.rng.getrandbits(128) or 1


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
        conversation_ids: bool = False,
    ) -> None:
        self.placements = {p.replica: p for p in placements}
        self._conversation_ids = conversation_ids
        self._processor = processor
        self._ids = id_generator or RandomIdGenerator()
        self._next_process_id = FIRST_PROCESS_ID
        self._resources = {
            replica: self._new_resource(placement) for replica, placement in self.placements.items()
        }
        # Replicas whose process reports another model name than their placement (a rollout).
        self._models: dict[str, str] = {}
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
        extra = _gateway_attributes(
            record.tenant, record.conversation_id if self._conversation_ids else None
        )
        span = request_span(
            request_timing(record, model=self._models.get(record.replica, placement.model)),
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
            if event.model is None:
                self._models.pop(event.replica, None)
            else:
                self._models[event.replica] = event.model

    def flush(self) -> bool:
        return self._processor.force_flush()

    def shutdown(self) -> None:
        self._processor.shutdown()


def _float_attribute(key: str) -> str:
    return key_prefix(key) + '"doubleValue":'


def _int_attribute(key: str) -> str:
    return key_prefix(key) + '"intValue":"'


def _string_attribute(key: str) -> str:
    return key_prefix(key) + '"stringValue":'


SpanFields = tuple[
    str, str, str | None, str | None, float, float, float, float, int, int, int, FinishedReason
]
"""What a request's span is made of: `span_fields(record)`."""
_SPAN_FIELD_NAMES = (
    "replica", "request_id", "tenant", "conversation_id", "arrival_s", "queue_s", "prefill_s",
    "decode_s", "prompt_tokens", "completion_tokens", "max_tokens", "finished_reason",
)  # fmt: skip
_span_fields = operator.attrgetter(*_SPAN_FIELD_NAMES)


def _gateway_attributes(
    tenant: str | None, conversation_id: str | None
) -> dict[str, AttributeValue] | None:
    """What a gateway adds to the span: the tenant, then the conversation, when known."""
    if tenant is None and conversation_id is None:
        return None
    extra: dict[str, AttributeValue] = {}
    if tenant is not None:
        extra[TENANT_ATTRIBUTE] = tenant
    if conversation_id is not None:
        extra[CONVERSATION_ATTRIBUTE] = conversation_id
    return extra


def span_fields(record: FinishedRequest) -> SpanFields:
    """The fields of `record` its span is made of, in `SpanFields` order."""
    fields: SpanFields = _span_fields(record)
    return fields


class LineStream(Protocol):
    """Where span lines go: a text file, or anything that takes text the same way."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


_SPAN_HEAD = '{"traceId":"'
_SPAN_NAME_KIND = (
    f',"name":{json_string(SPAN_NAME)},"kind":{SpanKind.SERVER.value + 1}'  # OTLP counts from 1
)
_REQUEST_ID = _string_attribute("gen_ai.request.id")
_PROMPT_TOKENS = _int_attribute("gen_ai.usage.prompt_tokens")
_COMPLETION_TOKENS = _int_attribute("gen_ai.usage.completion_tokens")
_QUEUE = _float_attribute("gen_ai.latency.time_in_queue")
_TTFT = _float_attribute("gen_ai.latency.time_to_first_token")
_E2E = _float_attribute("gen_ai.latency.e2e")
_PREFILL = _float_attribute("gen_ai.latency.time_in_model_prefill")
_DECODE = _float_attribute("gen_ai.latency.time_in_model_decode")
_INFERENCE = _float_attribute("gen_ai.latency.time_in_model_inference")
_MODEL = _string_attribute("gen_ai.response.model")
_MAX_TOKENS = _int_attribute("gen_ai.request.max_tokens")
_ERROR_TYPE = _string_attribute("error.type")
_TENANT = _string_attribute(TENANT_ATTRIBUTE)
_CONVERSATION = _string_attribute(CONVERSATION_ATTRIBUTE)
_FLAGS = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE, which the SDK always sets


class JsonLinesSpanOutput(SpanOutput):
    """Fixture mode's span output: the same lines as `SpanOutput` through
    `SyncBatchSpanProcessor` and `OtlpJsonLinesExporter` with `SeededIdGenerator(seed)`,
    written straight from the records.

    A day is 1.7M spans, and building each as an SDK span first costs more than the rest of
    fixture mode together. Each span's JSON is formatted from the record (attributes in
    `request_attributes` order, the encoder's number formats); resources are encoded once per
    process. A record the direct text cannot express exactly (a value of another type, a time
    at or before the epoch) goes through the SDK span and encoder instead. Tests hold both to
    equality.
    """

    def __init__(
        self,
        placements: Iterable[ReplicaPlacement],
        stream: LineStream,
        *,
        seed: int,
        spans_per_line: int = 512,
        conversation_ids: bool = False,
    ) -> None:
        if spans_per_line < 1:
            raise ValueError(f"spans_per_line must be at least 1, got {spans_per_line}")
        ids = SeededIdGenerator(seed)
        super().__init__(
            placements, _NoProcessor(), id_generator=ids, conversation_ids=conversation_ids
        )
        self._rng = ids.rng
        self._stream = stream
        self._spans_per_line = spans_per_line
        # Per replica: its current resource, that resource's entry text (before, after), and
        # the model name its process reports, plain and quoted.
        self._entry: dict[str, tuple[Resource, str, str, str, str]] = {}
        self._pending: dict[str, list[str]] = {}  # entry prefix -> span texts, first seen first
        self._after: dict[str, str] = {}  # entry prefix -> the entry's closing text
        self._pending_count = 0
        self._quoted: dict[str, str] = {}  # model names and tenants, quoted once

    def _quote(self, value: str) -> str:
        quoted = self._quoted.get(value)
        if quoted is None:
            quoted = json_string(value)
            if len(self._quoted) < 4096:
                self._quoted[value] = quoted
        return quoted

    def request_finished(self, record: FinishedRequest) -> None:
        self.request_fields(span_fields(record))

    def _gateway_text(self, tenant: str | None, conversation_id: str | None) -> str:
        """The attributes `_gateway_attributes` gives, as span text after the engine's."""
        text = "" if tenant is None else f",{_TENANT}{self._quote(tenant)}}}}}"
        if conversation_id is not None:
            text += f",{_CONVERSATION}{json_string(conversation_id)}}}}}"
        return text

    def request_fields(self, fields: SpanFields) -> None:
        """`request_finished` for the record's `span_fields` (what crosses to a helper
        process: a tuple pickles far faster than the record)."""
        (
            replica,
            request_id,
            tenant,
            conversation_id,
            arrival_s,
            queue_s,
            prefill_s,
            decode_s,
            prompt,
            completion,
            max_tokens,
            reason,
        ) = fields
        resource = self._resources.get(replica)
        if resource is None:
            self._placement(replica)  # raises the unknown-replica error
            return
        conversation_id = conversation_id if self._conversation_ids else None
        entry = self._entry.get(replica)
        if entry is None or entry[0] is not resource:
            model = self._models.get(replica) or self.placements[replica].model
            entry = (resource, *resource_spans_parts(resource, SCOPE), model, json_string(model))
            self._entry[replica] = entry
        trace_id = self._rng.getrandbits(128) or 1
        span_id = self._rng.getrandbits(64) or 1
        text: str | None = None
        # Exact types only: an int where a float is usual (or the reverse) is written as the
        # general encoder decides, and so is a start at or before the epoch.
        if (
            type(queue_s) is float
            and type(prefill_s) is float
            and type(decode_s) is float
            and type(arrival_s) is float
            and type(prompt) is int
            and type(completion) is int
            and type(max_tokens) is int
            and min(prompt, completion, max_tokens) >= -_INT64
            and max(prompt, completion, max_tokens) < _INT64
        ):
            # The sums as RequestTiming computes them, so the floats are the same.
            ttft_s = queue_s + prefill_s
            e2e_s = queue_s + prefill_s + decode_s
            inference_s = prefill_s + decode_s
            start_ns = round(arrival_s * NS_PER_S)
            end_ns = start_ns + round(e2e_s * NS_PER_S)
            if start_ns > 0 and end_ns > 0:
                text = (
                    f'{_SPAN_HEAD}{trace_id:032x}","spanId":"{span_id:016x}"{_SPAN_NAME_KIND}'
                    f',"startTimeUnixNano":"{start_ns}","endTimeUnixNano":"{end_ns}",'
                    f'"attributes":[{_REQUEST_ID}{json_string(request_id)}}}}},'
                    f'{_PROMPT_TOKENS}{prompt}"}}}},{_COMPLETION_TOKENS}{completion}"}}}},'
                    f"{_QUEUE}{queue_s!r}}}}},{_TTFT}{ttft_s!r}}}}},{_E2E}{e2e_s!r}}}}},"
                    f"{_PREFILL}{prefill_s!r}}}}},{_DECODE}{decode_s!r}}}}},"
                    f"{_INFERENCE}{inference_s!r}}}}},{_MODEL}{entry[4]}}}}},"
                    f'{_MAX_TOKENS}{max_tokens}"}}}}'
                )
                failed = reason is FinishedReason.ERROR or reason is FinishedReason.ABORT
                if failed:
                    quoted = self._quote(reason.value)
                    text += f",{_ERROR_TYPE}{quoted}}}}}"
                if tenant is not None or conversation_id is not None:
                    text += self._gateway_text(tenant, conversation_id)
                if failed:
                    text += f'],"status":{{"message":{quoted},"code":2}},"flags":{_FLAGS}}}'
                else:
                    text += f'],"status":{{}},"flags":{_FLAGS}}}'
        if text is None:
            text = _sdk_span_text(
                fields, entry[3], trace_id, span_id, resource, conversation_id=conversation_id
            )
        group = self._pending.get(entry[1])
        if group is None:
            self._pending[entry[1]] = [text]
            self._after[entry[1]] = entry[2]
        else:
            group.append(text)
        self.spans_emitted += 1
        self._pending_count += 1
        if self._pending_count >= self._spans_per_line:
            self._write_line()

    def _write_line(self) -> None:
        if not self._pending_count:
            return
        entries = [
            before + ",".join(spans) + self._after[before]
            for before, spans in self._pending.items()
        ]
        self._pending = {}
        self._pending_count = 0
        self._stream.write(export_line(entries) + "\n")

    def flush(self) -> bool:
        self._write_line()
        self._stream.flush()
        return True

    def shutdown(self) -> None:
        self.flush()


_INT64 = 2**63


class _NoProcessor(SpanProcessor):
    """`JsonLinesSpanOutput` writes its lines itself."""


def _sdk_span_text(
    fields: SpanFields,
    model: str,
    trace_id: int,
    span_id: int,
    resource: Resource,
    *,
    conversation_id: str | None,
) -> str:
    """One span's text through the SDK span and the general encoder; `conversation_id` is
    the one to write (None when the output does not name conversations)."""
    (
        replica,
        request_id,
        tenant,
        _,
        arrival,
        queue,
        prefill,
        decode,
        prompt,
        completion,
        most,
        why,
    ) = fields
    record = FinishedRequest(
        replica, request_id, conversation_id, tenant, arrival, queue, prefill, decode, prompt, 0,
        completion, most, why,
    )  # fmt: skip
    context = SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    extra = _gateway_attributes(tenant, conversation_id)
    span = request_span(
        request_timing(record, model=model),
        context=context,
        resource=resource,
        scope=SCOPE,
        extra_attributes=extra,
    )
    line = spans_to_otlp_json([span])
    # The single-span document's span text: between the resource entry's opening and closing.
    before, after = resource_spans_parts(resource, SCOPE)
    prefix = export_line([before])[: -len("]}")]
    if not (line.startswith(prefix) and line.endswith(after + "]}")):
        raise ValueError(f"span of request {request_id} cannot be written as OTLP JSON")
    return line[len(prefix) : -len(after + "]}")]


def jsonl_span_output(
    placements: Iterable[ReplicaPlacement],
    stream: LineStream,
    *,
    seed: int,
    spans_per_line: int = 512,
    conversation_ids: bool = False,
) -> JsonLinesSpanOutput:
    """Fixture mode: spans as OTLP JSON lines on `stream`, `spans_per_line` per line; with
    `conversation_ids`, each names its conversation as a gateway would."""
    return JsonLinesSpanOutput(
        placements,
        stream,
        seed=seed,
        spans_per_line=spans_per_line,
        conversation_ids=conversation_ids,
    )


def otlp_http_span_output(
    placements: Iterable[ReplicaPlacement],
    *,
    endpoint: str,
    timeout_s: float = 10.0,
    max_queue_size: int = 65536,
    schedule_delay_ms: float = 500.0,
    id_generator: IdGenerator | None = None,
    conversation_ids: bool = False,
) -> SpanOutput:
    """Live mode: spans sent with the SDK's OTLP/HTTP (protobuf) exporter to `endpoint`
    (the full URL, e.g. http://127.0.0.1:4318/v1/traces); with `conversation_ids`, each
    names its conversation as a gateway would.

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
    return SpanOutput(
        placements, processor, id_generator=id_generator, conversation_ids=conversation_ids
    )
