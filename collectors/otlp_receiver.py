"""The OTLP/HTTP trace receiver: `POST /v1/traces` with protobuf or JSON bodies, on 127.0.0.1.

Request handling (`handle_export`) is a pure function from a request to a response and a batch,
so its rules are tested without a socket; `OtlpHttpReceiver` only moves bytes. Accepted batches go
to a `TraceBatchSink` (the store's single writer in production). Status codes follow the OTLP/HTTP
specification: 400 undecodable body, 401 missing or wrong bearer token, 413 body over the limit,
415 unknown content type; spans that are decodable but unusable are reported back through
`partial_success` and the rest of the batch is kept.
"""

from __future__ import annotations

import hmac
import itertools
import json
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

import orjson
import polars as pl
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from collectors.otlp_json import DecodedRequest, decode_trace_request
from collectors.otlp_protobuf import MappedRequest, OtlpProtobufError, map_request_spans
from collectors.request_spans import RequestRows, SpanMapping, SpanMappingError
from collectors.trace_ingest import Reject

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SOURCE = "otlp-http"


@dataclass(frozen=True)
class ReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 4318
    max_body_bytes: int = 16 * 1024 * 1024
    bearer_token: str | None = None
    mapping: SpanMapping = field(default_factory=SpanMapping)


class TraceBatchSink(Protocol):
    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> None: ...


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


def _error(status: int, message: str) -> ExportOutcome:
    # OTLP answers errors with a google.rpc.Status; a JSON message is what clients log.
    return ExportOutcome(status, JSON, json.dumps({"code": status, "message": message}).encode())


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


class _RefusedError(Exception):
    """The request is answered with an error status and contributes nothing."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _check_authorization(authorization: str | None, config: ReceiverConfig) -> None:
    if config.bearer_token is None:
        return
    expected = f"Bearer {config.bearer_token}"
    if authorization is None or not hmac.compare_digest(authorization, expected):
        raise _RefusedError(401, "missing or wrong bearer token")


def _decompressed(body: bytes, content_encoding: str, *, limit: int) -> bytes:
    if len(body) > limit:
        raise _RefusedError(413, f"body of {len(body)} bytes exceeds the limit {limit}")
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "gzip":
        message = f"content encoding {encoding!r} is not supported; use gzip or none"
        raise _RefusedError(415, message)
    try:
        # At most one byte past the limit is inflated, so a gzip bomb cannot exhaust memory.
        inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body, limit + 1)
    except zlib.error as exc:
        raise _RefusedError(400, f"body is not valid gzip: {exc}") from exc
    if len(inflated) > limit:
        raise _RefusedError(413, f"decompressed body exceeds the limit {limit}")
    return inflated


def _mapped(body: bytes, media: str, rows: RequestRows) -> MappedRequest:
    """Decode the body and add its request spans to `rows`; refuse what cannot be decoded."""
    if media == PROTOBUF:
        try:
            return map_request_spans(body, rows, source=SOURCE)
        except OtlpProtobufError as exc:
            raise _RefusedError(400, str(exc)) from exc
    if media == JSON:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            message = f"body is not valid JSON: {exc.msg} at column {exc.colno}"
            raise _RefusedError(400, message) from exc
        return _map_decoded(decode_trace_request(doc), rows)
    raise _RefusedError(415, f"content type {media!r} is not supported; use {PROTOBUF} or {JSON}")


def _map_decoded(decoded: DecodedRequest, rows: RequestRows) -> MappedRequest:
    if decoded.errors and decoded.errors[0].path in ("$", "resourceSpans"):
        raise _RefusedError(400, str(decoded.errors[0]))
    result = MappedRequest(spans=len(decoded.spans), errors=decoded.errors)
    for span in decoded.spans:
        if not rows.is_request(span):
            continue
        result.request_spans += 1
        try:
            rows.add(span, source=SOURCE)
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
) -> ExportOutcome:
    """Decide the answer to one export request and the rows it contributes."""
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    rows = RequestRows(mapping=config.mapping)
    try:
        _check_authorization(authorization, config)
        raw = _decompressed(body, content_encoding, limit=config.max_body_bytes)
        mapped = _mapped(raw, media, rows)
    except _RefusedError as refused:
        return _error(refused.status, str(refused))

    stamp = (received_ts or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    where = f"request {next(_request_numbers)} at {stamp}"
    rejects = [Reject(SOURCE, f"{where} {e.path}", e.message) for e in mapped.errors]
    rejects += [
        Reject(SOURCE, f"{where} span {span_id}", message) for span_id, message in mapped.unusable
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


class OtlpHttpReceiver:
    """A threaded HTTP server answering OTLP trace exports; `start()` and `stop()` it."""

    def __init__(
        self,
        config: ReceiverConfig,
        sink: TraceBatchSink,
        *,
        on_accepted: Callable[[ExportOutcome], None] | None = None,
    ) -> None:
        """`on_accepted` sees every accepted export's outcome, body included (recording)."""
        self.config = config
        self.sink = sink
        self.on_accepted = on_accepted
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # the receiver reports through its sink and counters, not stderr

            def _send(self, outcome: ExportOutcome) -> None:
                self.send_response(outcome.status)
                self.send_header("Content-Type", outcome.content_type)
                self.send_header("Content-Length", str(len(outcome.body)))
                self.end_headers()
                self.wfile.write(outcome.body)

            def do_POST(self) -> None:
                if self.path.split("?")[0] != TRACES_PATH:
                    self._send(_error(404, f"only {TRACES_PATH} is served"))
                    return
                length = int(self.headers.get("Content-Length") or 0)
                if length > receiver.config.max_body_bytes:
                    self._send(_error(413, f"body of {length} bytes exceeds the limit"))
                    self.close_connection = True
                    return
                body = self.rfile.read(length)
                outcome = handle_export(
                    body,
                    content_type=self.headers.get("Content-Type", ""),
                    content_encoding=self.headers.get("Content-Encoding", ""),
                    authorization=self.headers.get("Authorization"),
                    config=receiver.config,
                )
                if outcome.rows is not None:
                    receiver.sink.submit(outcome.rows, list(outcome.rejects))
                    if receiver.on_accepted is not None:
                        receiver.on_accepted(outcome)
                self._send(outcome)

            def do_GET(self) -> None:
                self._send(_error(405, f"use POST {TRACES_PATH}"))

        self._server = ThreadingHTTPServer((config.host, config.port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://{self.config.host}:{self.port}{TRACES_PATH}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        # shutdown() waits for serve_forever to end, so only call it once that loop runs.
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
