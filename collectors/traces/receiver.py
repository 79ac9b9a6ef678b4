"""The OTLP/HTTP trace receiver: `POST /v1/traces` with protobuf or JSON bodies, on 127.0.0.1.

Request handling (`handle_export`) is a pure function from a request to a response and a batch,
so its rules are tested without a socket; `OtlpHttpReceiver` only moves bytes. Accepted batches go
to a `TraceBatchSink` (the store's single writer in production).

A 2xx means the spans are committed to the store: the handler waits for the sink's commit of
its batch (the writer still merges concurrent exports into one insert) and answers only then,
so a client never has to resend what was acknowledged, even if the process is killed right
after. A failed or late write, or a writer that is stopping, is answered 503 with Retry-After,
which OTLP clients retry; the store deduplicates what they send again.

Status codes follow the OTLP/HTTP specification: 400 undecodable body or malformed framing,
401 missing or wrong bearer token, 404 other paths, 408 a client too slow to send its request
(`read_timeout_s` per read), 411 neither Content-Length nor chunked, 413 body over the limit,
415 unknown content type or encoding, 501 a transfer coding other than chunked, 503 not
committed or every connection slot in use (`max_connections`). The token and the framing are
checked before a byte of the body is read, and a body over the limit is never read: those
refusals close the connection. Chunked bodies are read chunk by chunk up to the limit. Spans
that are decodable but unusable are reported back through `partial_success` and the rest of
the batch is kept; nothing in a decodable body makes the receiver fail the request.
"""

from __future__ import annotations

import hmac
import io
import itertools
import json
import logging
import socket
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, HTTPServer
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

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
SOURCE = "otlp-http"
# Seconds a client is asked to wait before retrying a 503.
RETRY_AFTER_S = 2
# Bodies are read this much at a time, so memory follows what arrives, not what is announced.
READ_CHUNK_BYTES = 64 * 1024
# A refused request's body up to this size is read and dropped before the connection closes,
# so that a client still sending it sees the answer rather than a connection reset.
DISCARD_BYTES = 64 * 1024
_CHUNK_LINE_BYTES = 1024  # a chunk-size line (with extensions) or a trailer field, at most
_TRAILER_LINES = 32

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    host: str = "127.0.0.1"
    port: int = 4318
    max_body_bytes: int = 16 * 1024 * 1024
    bearer_token: str | None = None
    mapping: SpanMapping = field(default_factory=SpanMapping)
    # Each read of a request (line, headers, a piece of the body, the next request of a kept
    # connection) waits this long; a silent client then loses its connection.
    read_timeout_s: float = 15.0
    # Connections served at once, each on its own thread; more are answered 503 at once.
    # Memory is bounded by about three bodies (raw, inflated, decoded) per connection.
    max_connections: int = 64
    # How long an export waits for its spans to be committed before it is answered 503.
    commit_timeout_s: float = 10.0


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


def _error(status: int, message: str) -> ExportOutcome:
    # OTLP answers errors with a google.rpc.Status; a JSON message is what clients log.
    body = json.dumps({"code": status, "message": message}).encode()
    retry_after_s = RETRY_AFTER_S if status == 503 else None
    return ExportOutcome(status, JSON, body, retry_after_s=retry_after_s)


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
    if authorization is None or not _token_matches(authorization, config.bearer_token):
        raise _RefusedError(401, "missing or wrong bearer token")


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


def _body_length(headers: Message, limit: int) -> int | None:
    """The announced body length, None for a chunked body; refuses bodies that are not framed
    by exactly one of the two, and announced lengths over `limit`."""
    codings = headers.get_all("Transfer-Encoding") or []
    lengths = headers.get_all("Content-Length") or []
    if codings:
        coding = ", ".join(codings).strip().lower()
        if coding != "chunked":
            raise _RefusedError(501, f"transfer coding {coding!r} is not supported; use chunked")
        if lengths:
            raise _RefusedError(400, "a chunked request must not also send Content-Length")
        return None
    if not lengths:
        raise _RefusedError(411, "Content-Length is required (or Transfer-Encoding: chunked)")
    if len({value.strip() for value in lengths}) > 1:
        raise _RefusedError(400, f"conflicting Content-Length values {lengths}")
    text = lengths[0].strip()
    if not (text.isascii() and text.isdigit()):
        raise _RefusedError(400, f"Content-Length must be a number of bytes, got {text!r}")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(limit)) or int(digits) > limit:
        raise _RefusedError(413, f"body of {digits} bytes exceeds the limit {limit}")
    return int(digits)


def _read_exactly(rfile: io.BufferedIOBase, size: int) -> bytes:
    body = bytearray()
    while len(body) < size:
        piece = rfile.read(min(READ_CHUNK_BYTES, size - len(body)))
        if not piece:
            raise _RefusedError(400, f"the body ended after {len(body)} of {size} bytes")
        body += piece
    return bytes(body)


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", maxsplit=1)[0].strip()
    if not line.endswith(b"\n") or not 0 < len(size) <= 16 or size.strip(_HEX_DIGITS):
        raise _RefusedError(400, f"malformed chunk size line {line[:40]!r}")
    return int(size, 16)


_HEX_DIGITS = b"0123456789abcdefABCDEF"


def _read_chunked(rfile: io.BufferedIOBase, limit: int) -> bytes:
    """A chunked body, refused (413) as soon as its chunks pass `limit`; trailers are dropped."""
    body = bytearray()
    while size := _chunk_size(rfile.readline(_CHUNK_LINE_BYTES)):
        if len(body) + size > limit:
            raise _RefusedError(413, f"chunked body exceeds the limit {limit}")
        body += _read_exactly(rfile, size)
        if rfile.readline(_CHUNK_LINE_BYTES) not in (b"\r\n", b"\n"):
            raise _RefusedError(400, "a chunk is not followed by CRLF")
    for _ in range(_TRAILER_LINES):
        line = rfile.readline(_CHUNK_LINE_BYTES)
        if line in (b"\r\n", b"\n"):
            return bytes(body)
        if not line.endswith(b"\n"):
            break
    raise _RefusedError(400, "malformed or overlong trailer section")


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
    """An HTTP server answering OTLP trace exports; `start()` and `stop()` it."""

    def __init__(
        self,
        config: ReceiverConfig,
        sink: TraceBatchSink,
        *,
        on_accepted: Callable[[ExportOutcome], None] | None = None,
    ) -> None:
        """`on_accepted` sees every committed export's outcome, body included (recording)."""
        self.config = config
        self.sink = sink
        self.on_accepted = on_accepted
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = config.read_timeout_s  # set on the socket: every read waits this long

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # the receiver reports through its sink and counters, not stderr

            def _send(self, outcome: ExportOutcome) -> None:
                self.send_response(outcome.status)
                self.send_header("Content-Type", outcome.content_type)
                self.send_header("Content-Length", str(len(outcome.body)))
                if outcome.retry_after_s is not None:
                    self.send_header("Retry-After", str(outcome.retry_after_s))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(outcome.body)

            def _admit(self) -> int | ExportOutcome | None:
                """The body's length (None: chunked), or the refusal to answer unread."""
                try:
                    if self.path.split("?")[0] != TRACES_PATH:
                        raise _RefusedError(404, f"only {TRACES_PATH} is served")
                    _check_authorization(self.headers.get("Authorization"), receiver.config)
                    return _body_length(self.headers, receiver.config.max_body_bytes)
                except _RefusedError as refused:
                    return _error(refused.status, str(refused))

            def _refuse_unread(self, outcome: ExportOutcome, *, sent_body: bool) -> None:
                self.close_connection = True
                self._send(outcome)
                length = self.headers.get("Content-Length", "")
                if sent_body and length.isascii() and length.isdigit():
                    size = int(length) if len(length) < 8 else DISCARD_BYTES + 1
                    if size <= DISCARD_BYTES:
                        # A client that is not sending its body holds the thread briefly only.
                        self.connection.settimeout(min(1.0, receiver.config.read_timeout_s))
                        self.rfile.read(size)

            def handle_expect_100(self) -> bool:
                # The client waits with its body until told to go on: refuse it before that.
                admitted = self._admit()
                if isinstance(admitted, ExportOutcome):
                    self._refuse_unread(admitted, sent_body=False)
                    return False
                return super().handle_expect_100()

            def do_POST(self) -> None:
                admitted = self._admit()
                if isinstance(admitted, ExportOutcome):
                    self._refuse_unread(admitted, sent_body=True)
                    return
                limit = receiver.config.max_body_bytes
                try:
                    if admitted is None:
                        body = _read_chunked(self.rfile, limit)
                    else:
                        body = _read_exactly(self.rfile, admitted)
                except _RefusedError as refused:
                    self.close_connection = True
                    self._send(_error(refused.status, str(refused)))
                    return
                except TimeoutError:
                    self.close_connection = True
                    message = f"no body data for {receiver.config.read_timeout_s:g} s"
                    self._send(_error(408, message))
                    return
                self._send(receiver.answer(body, self.headers))

            def do_GET(self) -> None:
                self._send(_error(405, f"use POST {TRACES_PATH}"))

        self._server = _BoundedHTTPServer(
            (config.host, config.port), Handler, max_connections=config.max_connections
        )
        self._thread: threading.Thread | None = None

    def answer(self, body: bytes, headers: Message) -> ExportOutcome:
        """The outcome of one export whose body has been read: accepted only once committed."""
        try:
            outcome = handle_export(
                body,
                content_type=headers.get("Content-Type", ""),
                content_encoding=headers.get("Content-Encoding", ""),
                authorization=headers.get("Authorization"),
                config=self.config,
            )
        except Exception:  # a bug, not the client's: say so, and do not invite a retry
            log.exception("OTLP export could not be handled")
            return _error(500, "the receiver failed on this request; it is not retried")
        if outcome.rows is None:
            return outcome
        try:
            self.sink.submit(outcome.rows, list(outcome.rejects)).wait(self.config.commit_timeout_s)
        except NotCommittedError as exc:
            return _error(503, f"spans not stored, send them again: {exc}")
        if self.on_accepted is not None:
            self.on_accepted(outcome)
        return outcome

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
        """Stop accepting; exports in progress still get their answer (a 503 once the sink
        refuses them)."""
        # shutdown() waits for serve_forever to end, so only call it once that loop runs.
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()


class _BoundedHTTPServer(HTTPServer):
    """Each connection on its own daemon thread, at most `max_connections` at once. One more is
    answered 503 by the accepting thread and closed: the accept loop never waits, and threads
    and buffered bodies stay bounded however many clients connect or idle."""

    # The listen backlog: socketserver's 5 drops the connections of a burst (a fleet's
    # exporters at once) while the accept loop catches up, and dropped SYNs wait 1 s to retry.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        max_connections: int,
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        busy = _error(503, f"all {max_connections} connections are in use; retry later")
        self._busy = (
            f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: {busy.content_type}\r\n"
            f"Content-Length: {len(busy.body)}\r\nRetry-After: {busy.retry_after_s}\r\n"
            "Connection: close\r\n\r\n"
        ).encode() + busy.body

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: object
    ) -> None:
        assert isinstance(request, socket.socket)  # a stream server's requests are sockets
        if not self._slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(self._busy)
            except OSError:
                pass  # the client is gone; nothing to tell it
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve, args=(request, client_address), name="otlp-http", daemon=True
        )
        thread.start()

    def _serve(self, request: socket.socket, client_address: object) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # one connection's failure must not end the server
            log.exception("OTLP connection from %s failed", client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()
