"""`servewatch run` under the OTLP faults of the fault campaign, as a real process: killed with
SIGKILL during exports it keeps every acknowledged span, and an unauthenticated request
announcing a huge body is refused without the process growing."""

from __future__ import annotations

import http.client
import os
import queue
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from servewatch.store import Store
from tests.conftest import free_port
from tests.test_otlp_receiver import make_spans, protobuf_body
from tests.test_service import SERVEWATCH

TOKEN = "fault-campaign"


@contextmanager
def running_service(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    """A `servewatch run` with a bearer token, its OTLP port, and its store; killed at the end
    unless the test ended it."""
    port, db = free_port(), tmp_path / "fleet.duckdb"
    config = tmp_path / "servewatch.toml"
    config.write_text(
        f'[store]\npath = "{db}"\n[otlp]\nlisten = "127.0.0.1:{port}"\n'
        f'grpc_listen = "127.0.0.1:0"\nbearer_token = "{TOKEN}"\n',
        encoding="utf-8",
    )
    process = subprocess.Popen(
        [*SERVEWATCH, "run", "--config", str(config), "--health-port", str(free_port())],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
        text=True,
    )
    try:
        assert process.stderr is not None
        # The receiver's socket is bound before this line is printed: connections queue on it.
        for line in process.stderr:
            if "servewatch run:" in line:
                break
        else:
            pytest.fail(f"servewatch run exited with {process.wait()} before serving")
        # The log must keep draining, or a full pipe would block the service.
        threading.Thread(target=process.stderr.read, daemon=True).start()
        yield process, port, db
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


@pytest.mark.slow
def test_sigkill_during_exports_loses_no_acknowledged_span(tmp_path: Path) -> None:
    exports: queue.Queue[tuple[bytes, list[str]]] = queue.Queue()
    for _ in range(120):
        spans = make_spans(50)
        ids = [format(span.context.span_id, "016x") for span in spans]  # type: ignore[union-attr]
        exports.put((protobuf_body(spans), ids))
    acknowledged: list[str] = []
    enough = threading.Event()
    lock = threading.Lock()

    def client(endpoint: str) -> None:
        headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=30) as http:
            while not exports.empty():
                body, ids = exports.get()
                try:
                    answer = http.post(endpoint, content=body, headers=headers)
                except httpx.HTTPError:
                    return  # the process is gone
                if answer.status_code == 200:
                    with lock:
                        acknowledged.extend(ids)
                        if len(acknowledged) >= 2000:
                            enough.set()

    with running_service(tmp_path) as (process, port, db):
        endpoint = f"http://127.0.0.1:{port}/v1/traces"
        clients = [threading.Thread(target=client, args=(endpoint,)) for _ in range(4)]
        for thread in clients:
            thread.start()
        assert enough.wait(timeout=60), "the service acknowledged too few exports"
        process.send_signal(signal.SIGKILL)  # while the clients are still sending
        process.wait(timeout=30)
        for thread in clients:
            thread.join(timeout=60)
        assert not exports.empty(), "every export finished before the kill"
    with lock:
        acked = set(acknowledged)
    with Store.open(db) as store:
        stored = set(store.read_requests().collect()["span_id"].to_list())
    assert len(acked) >= 2000
    assert acked <= stored, f"{len(acked - stored)} acknowledged spans were lost"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def stream_until_refused(sock: socket.socket, limit: int) -> int:
    """Send body bytes without blocking until the peer stops taking them; bytes sent."""
    sock.setblocking(False)
    chunk, sent = b"\0" * (1 << 20), 0
    try:
        while sent < limit:
            sent += sock.send(chunk)
    except (BlockingIOError, BrokenPipeError, ConnectionResetError):
        pass  # the receiver reads no more, or has closed the connection
    return sent


@pytest.mark.slow
@pytest.mark.parametrize("length", ["314572800", "-1"])
def test_an_unauthenticated_huge_body_is_refused_without_growing_the_process(
    tmp_path: Path, length: str
) -> None:
    with running_service(tmp_path) as (process, port, _):
        warm = protobuf_body(make_spans(20))
        headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
        endpoint = f"http://127.0.0.1:{port}/v1/traces"
        assert httpx.post(endpoint, content=warm, headers=headers, timeout=30).status_code == 200
        before = rss_bytes(process.pid)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                f"Content-Length: {length}\r\n\r\n".encode()
                + b"\0" * (1 << 20)
            )
            answer = http.client.HTTPResponse(sock)
            answer.begin()
            assert answer.status == 401
            stream_until_refused(sock, 64 << 20)
        grown = rss_bytes(process.pid) - before
        assert grown < 20 << 20, f"the receiving process grew by {grown / 2**20:.1f} MiB"
