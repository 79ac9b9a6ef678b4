"""The OTLP receiver on a socket: answered only once committed, the token and framing checked
before the body is read, bounded reads, connections and waits."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import polars as pl
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from servewatch.collectors.store_writer import StoreWriter, TraceCommit
from servewatch.collectors.traces.ingest import Reject
from servewatch.collectors.traces.receiver import OtlpHttpReceiver, ReceiverConfig, handle_export
from servewatch.store import Store
from tests.test_otlp_receiver import BODY, TOKEN, make_spans, protobuf_body

PROTOBUF_HEAD = "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
AUTH = f"Authorization: Bearer {TOKEN}\r\n"


@contextmanager
def serving(config: ReceiverConfig, sink: object) -> Iterator[OtlpHttpReceiver]:
    receiver = OtlpHttpReceiver(config, sink)  # type: ignore[arg-type]
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()


@contextmanager
def stored_receiver(**config: object) -> Iterator[tuple[OtlpHttpReceiver, StoreWriter, Store]]:
    settings = ReceiverConfig(**({"port": 0, "bearer_token": TOKEN} | config))  # type: ignore[arg-type]
    # A short linger: each export waits for its commit, and one client sends one at a time.
    with (
        Store.open(":memory:") as store,
        StoreWriter(store, linger_s=0.01) as writer,
        serving(settings, writer) as receiver,
    ):
        yield receiver, writer, store


def connect(receiver: OtlpHttpReceiver, *, timeout: float = 10) -> socket.socket:
    return socket.create_connection(("127.0.0.1", receiver.port), timeout=timeout)


def response(sock: socket.socket) -> http.client.HTTPResponse:
    answer = http.client.HTTPResponse(sock)
    answer.begin()
    return answer


def post(receiver: OtlpHttpReceiver, head: str, body: bytes = b"") -> http.client.HTTPResponse:
    """Send `head` (request line and headers, without the blank line) and `body` as they are."""
    with connect(receiver) as sock:
        sock.sendall(f"{head}\r\n".encode("latin-1") + body)
        answer = response(sock)
        answer.read()
        return answer


def export_head(body: bytes, *, auth: str = AUTH) -> str:
    return f"{PROTOBUF_HEAD}{auth}Content-Length: {len(body)}\r\n"


class RefusingSink:
    def submit(self, rows: pl.DataFrame, rejects: list[Reject]) -> TraceCommit:
        return TraceCommit.refused("disk full")


def test_an_export_is_answered_only_once_its_spans_are_committed() -> None:
    gate = threading.Event()
    with stored_receiver() as (receiver, writer, _store), connect(receiver) as sock:
        writer.submit_task(lambda s: gate.wait())  # the writer is busy: nothing commits
        sock.sendall(f"{export_head(BODY)}\r\n".encode() + BODY)
        sock.settimeout(0.5)
        try:
            with pytest.raises(TimeoutError):
                sock.recv(1)  # no answer while the spans are only queued
        finally:
            gate.set()  # also when the check fails, or the writer would never close
        sock.settimeout(10)
        assert response(sock).status == 200
        seen: list[int] = []
        writer.submit_task(lambda s: seen.append(s.count("requests")))
        writer.flush()
        assert seen == [3]


def test_an_uncommitted_export_is_answered_503_with_retry_after() -> None:
    with serving(ReceiverConfig(port=0), RefusingSink()) as receiver:
        answer = post(receiver, export_head(BODY, auth=""), BODY)
        assert answer.status == 503
        assert answer.getheader("Retry-After") == "2"
    with Store.open(":memory:") as store:
        writer = StoreWriter(store)
        with serving(ReceiverConfig(port=0), writer) as receiver:
            writer.close()
            answer = post(receiver, export_head(BODY, auth=""), BODY)
            assert answer.status == 503
            assert answer.getheader("Retry-After") == "2"
            assert store.count("requests") == 0


@pytest.mark.parametrize("length", ["10000000", "-1", "nonsense", ""])
def test_a_request_without_the_token_is_refused_before_its_body_is_read(length: str) -> None:
    with stored_receiver() as (receiver, _writer, _store), connect(receiver) as sock:
        announced = f"Content-Length: {length}\r\n" if length else ""
        sock.sendall(f"{PROTOBUF_HEAD}{announced}\r\n".encode())  # the body never comes
        answer = response(sock)
        assert answer.status == 401
        assert answer.getheader("Connection") == "close"
        assert b"bearer token" in answer.read()


@pytest.mark.parametrize(
    ("framing", "status", "message"),
    [
        ("", 411, b"Content-Length is required"),
        ("Content-Length: -1\r\n", 400, b"Content-Length must be a number of bytes"),
        ("Content-Length: 12abc\r\n", 400, b"Content-Length must be a number of bytes"),
        ("Content-Length: 5\r\nContent-Length: 6\r\n", 400, b"conflicting"),
        ("Content-Length: 99999999999999999999999\r\n", 413, b"exceeds the limit 200000"),
        ("Content-Length: 200001\r\n", 413, b"exceeds the limit 200000"),
        ("Transfer-Encoding: gzip, chunked\r\n", 501, b"transfer coding"),
        ("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", 400, b"must not also send"),
    ],
)
def test_body_framing_is_checked_before_the_body_is_read(
    framing: str, status: int, message: bytes
) -> None:
    with stored_receiver(max_body_bytes=200_000) as (receiver, writer, store):
        with connect(receiver) as sock:
            sock.sendall(f"{PROTOBUF_HEAD}{AUTH}{framing}\r\n".encode())  # and no body
            answer = response(sock)
            assert answer.status == status
            assert message in answer.read()
        writer.flush()
        assert store.count("requests") == 0


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-T: 1\r\n\r\n"


def test_chunked_bodies_are_read_up_to_the_limit() -> None:
    body = protobuf_body(make_spans(40))
    with stored_receiver(max_body_bytes=len(body)) as (receiver, _writer, store):
        head = f"{PROTOBUF_HEAD}{AUTH}Transfer-Encoding: chunked\r\n"
        assert post(receiver, head, chunked(body, 1000)).status == 200
        assert store.count("requests") == 40  # committed before the answer
        too_big = protobuf_body(make_spans(41))
        answer = post(receiver, head, chunked(too_big, 1000))
        assert answer.status == 413
        assert post(receiver, head, b"zz\r\n").status == 400
        assert post(receiver, head, b"5\r\nabcdeXY0\r\n\r\n").status == 400


def test_a_small_refused_body_is_drained_so_the_client_reads_the_answer() -> None:
    with stored_receiver() as (receiver, _writer, _store):
        assert post(receiver, export_head(BODY, auth=""), BODY).status == 401
        assert (
            post(receiver, export_head(BODY, auth="Authorization: Bearer no\r\n"), BODY).status
            == 401
        )


def test_expect_100_continue_is_refused_without_inviting_the_body() -> None:
    with stored_receiver() as (receiver, _writer, _store):
        head = f"{export_head(BODY, auth='')}Expect: 100-continue\r\n"
        answer = post(receiver, head)
        assert answer.status == 401
        with connect(receiver) as sock:
            sock.sendall(f"{export_head(BODY)}Expect: 100-continue\r\n\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
            sock.sendall(BODY)
            assert response(sock).status == 200


def test_a_silent_client_loses_its_connection_after_the_read_timeout() -> None:
    with stored_receiver(read_timeout_s=0.3) as (receiver, _writer, _store):
        with connect(receiver) as idle:
            idle.sendall(b"POST /v1/traces HTTP/1.1\r\n")  # and no more
            assert idle.recv(100) == b""  # closed by the server, not by the 10 s client wait
        with connect(receiver) as slow:
            slow.sendall(f"{export_head(BODY)}\r\n".encode() + BODY[:10])
            answer = response(slow)
            assert answer.status == 408
            assert b"no body data for 0.3 s" in answer.read()
        with connect(receiver) as kept:  # a kept-alive connection idles no longer either
            kept.sendall(f"{export_head(BODY)}\r\n".encode() + BODY)
            assert response(kept).status == 200
            assert kept.recv(100) == b""


def test_connections_beyond_the_bound_are_answered_503_and_threads_stay_bounded() -> None:
    with stored_receiver(max_connections=3) as (receiver, _writer, _store):
        threads = threading.active_count()
        idle = [connect(receiver) for _ in range(3)]
        crowd = [connect(receiver) for _ in range(50)]
        try:
            for sock in crowd:
                answer = response(sock)
                assert answer.status == 503
                assert answer.getheader("Retry-After") == "2"
            assert threading.active_count() <= threads + 3
        finally:
            for sock in idle + crowd:
                sock.close()
        # The slots come back as the idle connections close.
        deadline = time.monotonic() + 10
        while (status := post(receiver, export_head(BODY), BODY).status) == 503:
            assert time.monotonic() < deadline
        assert status == 200


def test_a_non_ascii_token_is_compared_as_bytes() -> None:
    token = "clé-ünï"
    config = ReceiverConfig(bearer_token=token)
    for authorization, status in [(f"Bearer {token}", 200), ("Bearer clé", 401), ("é", 401)]:
        outcome = handle_export(
            BODY,
            content_type="application/x-protobuf",
            content_encoding="",
            authorization=authorization,
            config=config,
        )
        assert outcome.status == status
    with stored_receiver(bearer_token=token) as (receiver, _writer, _store):
        for wire in (token.encode(), token.encode("latin-1")):  # UTF-8 (Go), Latin-1 (Python)
            with connect(receiver) as sock:
                head = f"{PROTOBUF_HEAD}Content-Length: {len(BODY)}\r\n".encode()
                sock.sendall(head + b"Authorization: Bearer " + wire + b"\r\n\r\n" + BODY)
                assert response(sock).status == 200


def test_a_span_resent_with_another_end_time_is_stored_once() -> None:
    request = ExportTraceServiceRequest.FromString(BODY)
    for span in request.resource_spans[0].scope_spans[0].spans:
        span.end_time_unix_nano += 7 * 3600 * 10**9
    moved = request.SerializeToString()
    with stored_receiver() as (receiver, _writer, store):
        assert post(receiver, export_head(BODY), BODY).status == 200
        assert post(receiver, export_head(moved), moved).status == 200
        assert store.count("requests") == 3
