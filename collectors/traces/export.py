"""One OTLP trace export, whichever listener received it: decoded, mapped, committed, answered.

Both receivers (OTLP/HTTP in `receiver`, OTLP/gRPC in `grpc_receiver`) hand an export's body to
`answer_export`: the bearer token is checked, the body decoded (protobuf or JSON), its request
spans mapped to rows (matched to scrape targets), and the rows submitted to the sink; the answer
comes only once the sink has committed them, so an acknowledged span is never lost. Decodable
but unusable spans are counted in `partial_success` and the rest is kept. Outcomes carry HTTP
status codes; the gRPC receiver answers their OTLP equivalents.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import orjson
import polars as pl
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from servewatch.collectors.store_writer import NotCommittedError
from servewatch.collectors.traces.ingest import Reject
from servewatch.collectors.traces.otlp_json import DecodedRequest, decode_trace_request
from servewatch.collectors.traces.otlp_protobuf import (
    MappedRequest,
    OtlpProtobufError,
    map_request_spans,
)
from servewatch.collectors.traces.request_spans import RequestRows, SpanMapping, SpanMappingError
from servewatch.collectors.traces.span_identity import TargetDirectory

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SOURCE_HTTP = "otlp-http"
SOURCE_GRPC = "otlp-grpc"
# Seconds a client is asked to wait before retrying a 503.
RETRY_AFTER_S = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    """The [otlp] settings both listeners share (HTTP on host:port, gRPC on grpc_host:grpc_port)."""

    host: str = "127.0.0.1"
    port: int = 4318
    max_body_bytes: int = 16 * 1024 * 1024
    bearer_token: str | None = None
    mapping: SpanMapping = field(default_factory=SpanMapping)
    # HTTP: each read of a request (line, headers, a piece of the body, the next request of a
    # kept connection) waits this long; a silent client then loses its connection.
    read_timeout_s: float = 15.0
    # HTTP connections served at once, each on its own thread, more answered 503 at once; gRPC
    # exports handled at once, more answered RESOURCE_EXHAUSTED. Memory is bounded by about
    # three bodies (raw, inflated, decoded) per connection or export.
    max_connections: int = 64
    # How long an export waits for its spans to be committed before it is answered 503
    # (gRPC: UNAVAILABLE).
    commit_timeout_s: float = 10.0
    # The OTLP/gRPC listener beside the HTTP one (vLLM's default protocol); same rules.
    grpc_enabled: bool = True
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 4317


class PendingCommit(Protocol):
    def wait(self, timeout_s: float) -> None:
        """Return once the batch is committed; raise NotCommittedError otherwise."""


class TraceBatchSink(Protocol):
    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> PendingCommit: ...


@dataclass(frozen=True)
class ExportOutcome:
    status: int
    content_type: str
    body: bytes
    rows: pl.DataFrame | None = None
    rejects: tuple[Reject, ...] = ()
    # Of an accepted export: its body after decompression, and how many spans it held.
    request_body: bytes | None = None
    spans: int = 0
    retry_after_s: int | None = None
    # Of a refused export: why, as the client should read it.
    message: str | None = None


def error_outcome(status: int, message: str) -> ExportOutcome:
    # OTLP answers errors with a google.rpc.Status; a JSON message is what clients log.
    body = json.dumps({"code": status, "message": message}).encode()
    retry_after_s = RETRY_AFTER_S if status == 503 else None
    return ExportOutcome(status, JSON, body, retry_after_s=retry_after_s, message=message)


def _response(*, protobuf: bool, rejected: int, message: str) -> bytes:
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if protobuf:
        return response.SerializeToString()
    doc: dict[str, object] = {}
    if rejected:
        doc["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
    return json.dumps(doc).encode()


_request_numbers = itertools.count(1)


class RefusedError(Exception):
    """The request is answered with an error status and contributes nothing."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_authorization(authorization: str | None, config: ReceiverConfig) -> None:
    if config.bearer_token is None:
        return
    if authorization is None or not _token_matches(authorization, config.bearer_token):
        raise RefusedError(401, "missing or wrong bearer token")


def _token_matches(authorization: str, token: str) -> bool:
    """Compared as bytes: compare_digest refuses str with non-ASCII characters. http.server
    decodes header bytes as Latin-1, so a client sending the token's UTF-8 (Go) matches through
    the header's Latin-1 bytes, and one sending Latin-1 (Python's http.client) as text."""
    expected = f"Bearer {token}".encode()
    try:
        wire = authorization.encode("latin-1")
    except UnicodeEncodeError:  # not from a socket: characters Latin-1 lacks
        wire = b""
    as_text = hmac.compare_digest(authorization.encode(), expected)
    return hmac.compare_digest(wire, expected) or as_text


def decompressed(body: bytes, content_encoding: str, *, limit: int) -> bytes:
    if len(body) > limit:
        raise RefusedError(413, f"body of {len(body)} bytes exceeds the limit {limit}")
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        message = f"content encoding {encoding!r} is not supported; use gzip or none"
        raise RefusedError(415, message)
    try:
        # At most one byte past the limit is inflated, so a gzip bomb cannot exhaust memory.
        inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, limit + 1)
    except zlib.error as exc:
        raise RefusedError(400, f"body is not valid gzip: {exc}") from exc
    if len(inflated) > limit:
        raise RefusedError(413, f"decompressed body exceeds the limit {limit}")
    return inflated


def _mapped(body: bytes, media: str, rows: RequestRows, source: str) -> MappedRequest:
    """Decode the body and add its request spans to `rows`; refuse what cannot be decoded."""
    if media == PROTOBUF:
        try:
            return map_request_spans(body, rows, source=source)
        except OtlpProtobufError as exc:
            raise RefusedError(400, str(exc)) from exc
    if media == JSON:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            message = f"body is not valid JSON: {exc.msg} at column {exc.colno}"
            raise RefusedError(400, message) from exc
        return _map_decoded(decode_trace_request(doc), rows, source)
    raise RefusedError(415, f"content type {media!r} is not supported; use {PROTOBUF} or {JSON}")


def _map_decoded(decoded: DecodedRequest, rows: RequestRows, source: str) -> MappedRequest:
    if decoded.errors and decoded.errors[0].path in ("$", "resourceSpans"):
        raise RefusedError(400, str(decoded.errors[0]))
    result = MappedRequest(spans=len(decoded.spans), errors=decoded.errors)
    for span in decoded.spans:
        if not rows.is_request(span):
            continue
        result.request_spans += 1
        try:
            rows.add(span, source=source)
        except SpanMappingError as exc:
            result.unusable.append((span.span_id, str(exc)))
    return result


def handle_export(
    body: bytes,
    *,
    content_type: str,
    content_encoding: str,
    authorization: str | None,
    config: ReceiverConfig,
    received_ts: datetime | None = None,
    source: str = SOURCE_HTTP,
    targets: TargetDirectory | None = None,
) -> ExportOutcome:
    """Decide the answer to one export request and the rows it contributes; `source` names
    the listener in the rows and rejects, `targets` are what spans are matched to."""
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    rows = RequestRows(mapping=config.mapping, targets=targets or TargetDirectory())
    try:
        check_authorization(authorization, config)
        raw = decompressed(body, content_encoding, limit=config.max_body_bytes)
        mapped = _mapped(raw, media, rows, source)
    except RefusedError as refused:
        return error_outcome(refused.status, str(refused))

    stamp = (received_ts or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    where = f"request {next(_request_numbers)} at {stamp}"
    rejects = [Reject(source, f"{where} {e.path}", e.message) for e in mapped.errors]
    rejects += [
        Reject(source, f"{where} span {span_id}", message) for span_id, message in mapped.unusable
    ]
    message = "; ".join(f"{r.location}: {r.message}" for r in rejects[:5])
    protobuf = media == PROTOBUF
    return ExportOutcome(
        status=200,
        content_type=PROTOBUF if protobuf else JSON,
        body=_response(protobuf=protobuf, rejected=len(rejects), message=message),
        rows=rows.to_frame(),
        rejects=tuple(rejects),
        request_body=raw,
        spans=mapped.spans,
    )


def commit_export(
    outcome: ExportOutcome,
    *,
    sink: TraceBatchSink,
    timeout_s: float,
    on_accepted: Callable[[ExportOutcome], None] | None = None,
) -> ExportOutcome:
    """The answer to an export `handle_export` decided: an accepted one only once its rows are
    committed (else 503, which clients retry), a refused one as it is."""
    if outcome.rows is None:
        return outcome
    try:
        sink.submit(outcome.rows, list(outcome.rejects)).wait(timeout_s)
    except NotCommittedError as exc:
        return error_outcome(503, f"spans not stored, send them again: {exc}")
    if on_accepted is not None:
        on_accepted(outcome)
    return outcome


def answer_export(
    body: bytes,
    *,
    content_type: str,
    content_encoding: str,
    authorization: str | None,
    config: ReceiverConfig,
    sink: TraceBatchSink,
    source: str,
    targets: TargetDirectory | None = None,
    on_accepted: Callable[[ExportOutcome], None] | None = None,
) -> ExportOutcome:
    """The outcome of one export whose body has been received: accepted only once committed."""
    try:
        outcome = handle_export(
            body,
            content_type=content_type,
            content_encoding=content_encoding,
            authorization=authorization,
            config=config,
            source=source,
            targets=targets,
        )
    except Exception:  # a bug, not the client's: say so, and do not invite a retry
        log.exception("OTLP export could not be handled")
        return error_outcome(500, "the receiver failed on this request; it is not retried")
    return commit_export(
        outcome, sink=sink, timeout_s=config.commit_timeout_s, on_accepted=on_accepted
    )
