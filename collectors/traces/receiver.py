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

import io
import logging
import socket
import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, HTTPServer

from servewatch.collectors.traces.export import (
    JSON,
    PROTOBUF,
    RETRY_AFTER_S,
    SOURCE_HTTP,
    ExportOutcome,
    PendingCommit,
    ReceiverConfig,
    RefusedError,
    TraceBatchSink,
    answer_export,
    check_authorization,
    error_outcome,
    handle_export,
)
from servewatch.collectors.traces.span_identity import TargetDirectory

# Names the receiver has always offered, now defined with the export they belong to.
__all__ = [
    "JSON",
    "PROTOBUF",
    "RETRY_AFTER_S",
    "SOURCE",
    "TRACES_PATH",
    "ExportOutcome",
    "OtlpHttpReceiver",
    "PendingCommit",
    "ReceiverConfig",
    "TraceBatchSink",
    "handle_export",
]

TRACES_PATH = "/v1/traces"
SOURCE = SOURCE_HTTP
# Bodies are read this much at a time, so memory follows what arrives, not what is announced.
READ_CHUNK_BYTES = 64 * 1024
# A refused request's body up to this size is read and dropped before the connection closes,
# so that a client still sending it sees the answer rather than a connection reset.
DISCARD_BYTES = 64 * 1024
_CHUNK_LINE_BYTES = 1024  # a chunk-size line (with extensions) or a trailer field, at most
_TRAILER_LINES = 32

log = logging.getLogger(__name__)


def _body_length(headers: Message, limit: int) -> int | None:
    """The announced body length, None for a chunked body; refuses bodies that are not framed
    by exactly one of the two, and announced lengths over `limit`."""
    codings = headers.get_all("Transfer-Encoding") or []
    lengths = headers.get_all("Content-Length") or []
    if codings:
        coding = ", ".join(codings).strip().lower()
        if coding != "chunked":
            raise RefusedError(501, f"transfer coding {coding!r} is not supported; use chunked")
        if lengths:
            raise RefusedError(400, "a chunked request must not also send Content-Length")
        return None
    if not lengths:
        raise RefusedError(411, "Content-Length is required (or Transfer-Encoding: chunked)")
    if len({value.strip() for value in lengths}) > 1:
        raise RefusedError(400, f"conflicting Content-Length values {lengths}")
    text = lengths[0].strip()
    if not (text.isascii() and text.isdigit()):
        raise RefusedError(400, f"Content-Length must be a number of bytes, got {text!r}")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(limit)) or int(digits) > limit:
        raise RefusedError(413, f"body of {digits} bytes exceeds the limit {limit}")
    return int(digits)


def _read_exactly(rfile: io.BufferedIOBase, size: int) -> bytes:
    body = bytearray()
    while len(body) < size:
        piece = rfile.read(min(READ_CHUNK_BYTES, size - len(body)))
        if not piece:
            raise RefusedError(400, f"the body ended after {len(body)} of {size} bytes")
        body += piece
    return bytes(body)


def _chunk_size(line: bytes) -> int:
    size = line.split(b";", maxsplit=1)[0].strip()
    if not line.endswith(b"\n") or not 0 < len(size) <= 16 or size.strip(_HEX_DIGITS):
        raise RefusedError(400, f"malformed chunk size line {line[:40]!r}")
    return int(size, 16)


_HEX_DIGITS = b"0123456789abcdefABCDEF"


def _read_chunked(rfile: io.BufferedIOBase, limit: int) -> bytes:
    """A chunked body, refused (413) as soon as its chunks pass `limit`; trailers are dropped."""
    body = bytearray()
    while size := _chunk_size(rfile.readline(_CHUNK_LINE_BYTES)):
        if len(body) + size > limit:
            raise RefusedError(413, f"chunked body exceeds the limit {limit}")
        body += _read_exactly(rfile, size)
        if rfile.readline(_CHUNK_LINE_BYTES) not in (b"\r\n", b"\n"):
            raise RefusedError(400, "a chunk is not followed by CRLF")
    for _ in range(_TRAILER_LINES):
        line = rfile.readline(_CHUNK_LINE_BYTES)
        if line in (b"\r\n", b"\n"):
            return bytes(body)
        if not line.endswith(b"\n"):
            break
    raise RefusedError(400, "malformed or overlong trailer section")


class OtlpHttpReceiver:
    """An HTTP server answering OTLP trace exports; `start()` and `stop()` it."""

    def __init__(
        self,
        config: ReceiverConfig,
        sink: TraceBatchSink,
        *,
        on_accepted: Callable[[ExportOutcome], None] | None = None,
        targets: Callable[[], TargetDirectory] = TargetDirectory,
    ) -> None:
        """`on_accepted` sees every committed export's outcome, body included (recording);
        `targets` gives the scrape targets spans are matched to, as they are now."""
        self.config = config
        self.sink = sink
        self.on_accepted = on_accepted
        self.targets = targets
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
                        raise RefusedError(404, f"only {TRACES_PATH} is served")
                    check_authorization(self.headers.get("Authorization"), receiver.config)
                    return _body_length(self.headers, receiver.config.max_body_bytes)
                except RefusedError as refused:
                    return error_outcome(refused.status, str(refused))

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
                except RefusedError as refused:
                    self.close_connection = True
                    self._send(error_outcome(refused.status, str(refused)))
                    return
                except TimeoutError:
                    self.close_connection = True
                    message = f"no body data for {receiver.config.read_timeout_s:g} s"
                    self._send(error_outcome(408, message))
                    return
                self._send(receiver.answer(body, self.headers))

            def do_GET(self) -> None:
                self._send(error_outcome(405, f"use POST {TRACES_PATH}"))

        self._server = _BoundedHTTPServer(
            (config.host, config.port), Handler, max_connections=config.max_connections
        )
        self._thread: threading.Thread | None = None

    def answer(self, body: bytes, headers: Message) -> ExportOutcome:
        """The outcome of one export whose body has been read: accepted only once committed."""
        return answer_export(
            body,
            content_type=headers.get("Content-Type", ""),
            content_encoding=headers.get("Content-Encoding", ""),
            authorization=headers.get("Authorization"),
            config=self.config,
            sink=self.sink,
            source=SOURCE,
            targets=self.targets(),
            on_accepted=self.on_accepted,
        )

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
        busy = error_outcome(503, f"all {max_connections} connections are in use; retry later")
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
