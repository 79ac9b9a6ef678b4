"""The scrape client against real local servers: kept-alive connections, the body framings and
encodings a server may use, and each failure named as a scrape error; on both event loops."""

from __future__ import annotations

import asyncio
import base64
import gzip
import zlib
from collections.abc import Awaitable, Callable

import httpx
import pytest

from servewatch.collectors.scrape import event_loop
from servewatch.collectors.scrape.loop import default_client
from servewatch.collectors.scrape.page_client import PageClient
from servewatch.collectors.scrape.scraper import ScrapeClient, ScrapeResult, scrape_target
from servewatch.collectors.scrape.targets import Target, TargetKind

PAGE = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3\n'

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(autouse=True, params=event_loop.LOOPS)
def loop_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on uvloop's event loop and on asyncio's: the scrape loop runs on either."""
    monkeypatch.setenv(event_loop.CHOICE, request.param)
    return str(request.param)


def target(port: int, path: str = "/metrics", userinfo: str = "") -> Target:
    return Target(
        target_id="t", kind=TargetKind.VLLM, url=f"http://{userinfo}127.0.0.1:{port}{path}"
    )


async def read_request(reader: asyncio.StreamReader) -> tuple[str, dict[str, str]]:
    request_line = (await reader.readline()).decode().strip()
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    return request_line, headers


def scrape_all(
    handler: Handler,
    *,
    times: int = 1,
    client: Callable[[], ScrapeClient] = PageClient,
    path: str = "/metrics",
    userinfo: str = "",
    limit: int = 64 * 1024 * 1024,
    between: float = 0.0,
) -> list[ScrapeResult]:
    async def main() -> list[ScrapeResult]:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        results = []
        try:
            async with client() as scraper:
                for _ in range(times):
                    results.append(
                        await scrape_target(
                            target(port, path, userinfo),
                            client=scraper,
                            timeout_s=2,
                            max_body_bytes=limit,
                        )
                    )
                    await asyncio.sleep(between)
        finally:
            server.close()
            await server.wait_closed()
        return results

    return event_loop.run(main())


def test_one_connection_serves_every_scrape_while_the_server_keeps_it() -> None:
    connections = []
    requests: list[tuple[str, dict[str, str]]] = []

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while not reader.at_eof():
            request = await read_request(reader)
            if not request[0]:
                break
            requests.append(request)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAGE)}\r\n\r\n".encode()
            writer.write(head + PAGE)
            await writer.drain()
        writer.close()

    results = scrape_all(keep_alive, times=4, path="/metrics?name%5B%5D=x")
    assert [r.body for r in results] == [PAGE.decode()] * 4
    assert all(r.ok and not r.openmetrics for r in results)
    assert len(connections) == 1
    request_line, headers = requests[0]
    assert request_line == "GET /metrics?name%5B%5D=x HTTP/1.1"
    assert headers["host"].startswith("127.0.0.1:")
    assert "gzip" in headers["accept-encoding"]
    assert "authorization" not in headers


@pytest.mark.parametrize("between", [0.0, 0.05])
def test_a_connection_the_server_closed_is_replaced(between: float) -> None:
    # The server answers once per connection without saying it closes: the client finds the
    # connection closed (at once, or as its request goes out) and connects anew.
    connections = []

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        await read_request(reader)
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAGE)}\r\n\r\n".encode() + PAGE)
        await writer.drain()
        writer.close()

    results = scrape_all(once, times=3, between=between)
    assert [r.error for r in results] == [None] * 3
    assert [r.body for r in results] == [PAGE.decode()] * 3
    assert len(connections) == 3


def serve(response: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        writer.close()

    return handler


def chunked(data: bytes, size: int = 7) -> bytes:
    parts = [
        f"{len(data[i : i + size]):x};ext=1\r\n".encode() + data[i : i + size] + b"\r\n"
        for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\nX-Trailer: 1\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "body"),
    [
        # HTTP/1.0, no length: the body ends with the connection.
        ("HTTP/1.0 200 OK\r\n", PAGE),
        ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n", chunked(PAGE)),
        (
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n",
            chunked(gzip.compress(PAGE)),
        ),
        (
            (
                "HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\n"
                f"Content-Length: {len(zlib.compress(PAGE))}\r\n"
            ),
            zlib.compress(PAGE),
        ),
        # Raw deflate, as some servers send it.
        ("HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\n", zlib.compress(PAGE, wbits=-15)),
        # Interim answers are passed over; header names are read in any case.
        (
            f"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-LENGTH: {len(PAGE)}\r\n",
            PAGE,
        ),
    ],
)
def test_bodies_in_every_framing_and_encoding(head: str, body: bytes) -> None:
    for make in (PageClient, httpx.AsyncClient):
        (result,) = scrape_all(serve(head.encode() + b"\r\n" + body), client=make)
        assert result.error is None, (make, result.error)
        assert result.body == PAGE.decode(), make


def test_openmetrics_is_noted_and_basic_auth_comes_from_the_url() -> None:
    seen: list[dict[str, str]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await read_request(reader))[1])
        body = b"# EOF\n"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    (result,) = scrape_all(handler, userinfo="scraper:p%40ss@")
    assert result.openmetrics
    assert result.body == "# EOF\n"
    assert seen[0]["authorization"] == "Basic " + base64.b64encode(b"scraper:p@ss").decode()


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "HTTP 404 from http://"),
        (b"HTTP/1.1 301 Moved\r\nLocation: /x\r\n\r\n", "HTTP 301 from http://"),
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "RemoteProtocolError: not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "RemoteProtocolError: malformed header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", "ReadError: the body ended"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "RemoteProtocolError: bad Content"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "RemoteProtocolError"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\nnot gzip", "DecodingError"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\nx", "DecodingError: unsupported"),
        (b"", "ReadError: the server closed the connection"),
    ],
)
def test_each_failure_is_named(response: bytes, expected: str) -> None:
    (result,) = scrape_all(serve(response))
    assert result.body is None
    assert result.error is not None
    assert result.error.startswith(expected), result.error


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n", "page of 2000000 bytes exceeds"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n"
            + gzip.compress(b"x 1\n" * (2 * 1024 * 1024)),
            "page exceeds the limit",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked(b"x 1\n" * (300 * 1024), size=64 * 1024),
            "page exceeds the limit",
        ),
        (b"HTTP/1.0 200 OK\r\n\r\n" + b"x 1\n" * (300 * 1024), "page exceeds the limit"),
    ],
)
def test_oversize_pages_are_refused_as_they_stream(response: bytes, expected: str) -> None:
    (result,) = scrape_all(serve(response), limit=1024 * 1024)
    assert result.error is not None
    assert result.error.startswith(expected), result.error


def test_a_refused_connection_is_a_connect_error() -> None:
    async def main() -> ScrapeResult:
        server = await asyncio.start_server(serve(b""), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        async with PageClient() as client:
            return await scrape_target(target(port), client=client, timeout_s=1)

    error = event_loop.run(main()).error
    assert error is not None
    assert error.startswith("ConnectError: ")


def test_a_url_the_environment_proxies_goes_through_the_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The proxy answers itself: what matters is that the request came to it, in proxy form.
    seen: list[str] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await read_request(reader))[0])
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(PAGE)}\r\n\r\n".encode() + PAGE)
        await writer.drain()
        writer.close()

    async def main() -> ScrapeResult:
        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        try:
            async with default_client() as client:
                return await scrape_target(
                    Target("t", TargetKind.VLLM, "http://replica.invalid:8000/metrics"),
                    client=client,
                    timeout_s=2,
                )
        finally:
            server.close()
            await server.wait_closed()

    result = event_loop.run(main())
    assert result.error is None
    assert result.body == PAGE.decode()
    assert seen == ["GET http://replica.invalid:8000/metrics HTTP/1.1"]
