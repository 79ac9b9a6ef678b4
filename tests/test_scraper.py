"""Scraping real local HTTP servers: a dead, slow, broken or erroring target harms no other."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Awaitable, Callable
from datetime import datetime

import httpx
import pytest

from servewatch.collectors.metrics.exposition import page_text
from servewatch.collectors.scrape.page_client import PageClient
from servewatch.collectors.scrape.scraper import (
    ACCEPT,
    ScrapeClient,
    scrape_target,
    scrape_targets,
)
from servewatch.collectors.scrape.targets import Target, TargetKind
from tests.conftest import free_port

PAGE = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3\n'
NOW = datetime(2026, 11, 29, 12, 0, 0)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def target(port: int, name: str) -> Target:
    url = f"http://127.0.0.1:{port}/metrics"
    return Target(target_id=name, kind=TargetKind.VLLM, url=url, replica=name)


async def read_request(reader: asyncio.StreamReader) -> dict[str, str]:
    headers: dict[str, str] = {}
    await reader.readline()
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode().partition(":")
        headers[key.strip().lower()] = value.strip()
    return headers


def respond(status: str, body: bytes, extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    return head.encode() + body


# The scrape client the loop uses, and httpx (still taken where a caller passes one).
CLIENTS = pytest.mark.parametrize("make_client", [PageClient, httpx.AsyncClient])


@CLIENTS
def test_each_failure_is_recorded_and_the_good_target_is_unaffected(
    make_client: type[ScrapeClient],
) -> None:
    seen_headers: list[dict[str, str]] = []
    release = asyncio.Event()

    async def good(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen_headers.append(await read_request(reader))
        body = gzip.compress(PAGE.encode())
        writer.write(
            respond(
                "200 OK",
                body,
                "Content-Type: text/plain; version=0.0.4\r\nContent-Encoding: gzip\r\n",
            )
        )
        await writer.drain()
        writer.close()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await release.wait()  # never answers within the scrape timeout
        writer.close()

    async def error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(respond("500 Internal Server Error", b"boom"))
        await writer.drain()
        writer.close()

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(respond("200 OK", b"\xff\xfe\x00garbage"))
        await writer.drain()
        writer.close()

    async def main() -> list[object]:
        servers = []
        targets = []
        for name, handler in (
            ("good", good),
            ("slow", slow),
            ("error", error),
            ("garbage", garbage),
        ):
            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            servers.append(server)
            targets.append(target(server.sockets[0].getsockname()[1], name))
        targets.append(target(free_port(), "down"))  # nothing listens there
        try:
            async with make_client() as client:
                return list(
                    await scrape_targets(targets, client=client, timeout_s=0.5, now=lambda: NOW)
                )
        finally:
            release.set()
            for server in servers:
                server.close()
                await server.wait_closed()

    results = {r.target.target_id: r for r in asyncio.run(main())}  # type: ignore[attr-defined]
    assert results["good"].ok
    assert results["good"].body == PAGE
    assert results["good"].duration_s < 0.5
    assert results["good"].started_ts == NOW
    assert seen_headers[0]["accept"] == ACCEPT
    assert "gzip" in seen_headers[0]["accept-encoding"]
    assert results["slow"].error == "timed out after 0.5 s"
    assert results["error"].error is not None
    assert results["error"].error.startswith("HTTP 500")
    # Bytes that are not UTF-8 reach the parser, which refuses only the lines holding them.
    assert results["garbage"].ok
    assert results["garbage"].body == page_text(b"\xff\xfe\x00garbage")
    assert results["down"].error is not None
    assert results["down"].error.startswith("ConnectError")


def test_openmetrics_content_type_is_noted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            text="# EOF\n",
            headers={"content-type": "application/openmetrics-text; version=1.0.0"},
        )

    async def main() -> bool:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            (result,) = await scrape_targets([target(1, "om")], client=client, timeout_s=1)
        return result.openmetrics

    assert asyncio.run(main())


@pytest.mark.parametrize("status", [404, 503])
def test_http_error_statuses(status: int) -> None:
    async def main() -> str | None:
        transport = httpx.MockTransport(lambda _: httpx.Response(status))
        async with httpx.AsyncClient(transport=transport) as client:
            (result,) = await scrape_targets([target(1, "x")], client=client, timeout_s=1)
        return result.error

    assert asyncio.run(main()) == f"HTTP {status} from http://127.0.0.1:1/metrics"


@CLIENTS
def test_an_endless_page_is_cut_off_at_the_limit_while_it_streams(
    make_client: type[ScrapeClient],
) -> None:
    # No Content-Length: only reading tells the size. The scraper stops reading at the limit,
    # so the server's writes fail long before the 256 MiB it means to send.
    limit = 1024 * 1024
    sent = [0]

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
        chunk = b"vllm:num_requests_running 1\n" * 2048
        try:
            while sent[0] < 256 * 1024 * 1024:
                writer.write(chunk)
                await writer.drain()
                sent[0] += len(chunk)
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def main() -> str | None:
        server = await asyncio.start_server(endless, "127.0.0.1", 0)
        try:
            async with make_client() as client:
                result = await scrape_target(
                    target(server.sockets[0].getsockname()[1], "endless"),
                    client=client,
                    timeout_s=10,
                    max_body_bytes=limit,
                )
        finally:
            server.close()
            await server.wait_closed()
        return result.error

    assert asyncio.run(main()) == (
        f"page exceeds the limit of {limit} bytes; the rest was not read"
    )
    assert sent[0] < 64 * 1024 * 1024


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        # Announced too large: refused before any of it is read.
        ({"content-length": str(2 * 1024 * 1024)}, b"", "page of 2097152 bytes exceeds"),
        # A small gzip body that inflates past the limit is cut off while it inflates.
        (
            {"content-encoding": "gzip"},
            gzip.compress(b"x 1\n" * (2 * 1024 * 1024)),
            "page exceeds the limit",
        ),
    ],
)
def test_oversize_pages_are_refused(headers: dict[str, str], body: bytes, expected: str) -> None:
    async def main() -> str | None:
        transport = httpx.MockTransport(
            lambda _: httpx.Response(200, headers=headers, content=body)
        )
        async with httpx.AsyncClient(transport=transport) as client:
            result = await scrape_target(
                target(1, "big"), client=client, timeout_s=1, max_body_bytes=1024 * 1024
            )
        return result.error

    error = asyncio.run(main())
    assert error is not None
    assert error.startswith(expected)
