"""A lean HTTP/1.1 client for scrapes: GET a page over connections kept alive between scrapes.

A scrape needs one GET, the status, two headers and the body. A general client pays for much
more: httpx spent ~1.7 ms of CPU a request on this machine (its request and response models,
the httpcore pool, anyio's streams), six times what the rest of a scrape's fetch costs. This
client speaks just what a scrape needs, on an asyncio `Protocol`: a request's bytes are built
once per URL, a response's head is read with `bytes` methods, and its body is handed on
without being copied again (`FetchedPage.body` is a view on the received bytes).

What it speaks: `http` and `https` (TLS verified with the given context), a body delimited by
`Content-Length`, chunked transfer encoding or the connection's end; `gzip` and `deflate`
content encodings (gzip is always offered); basic auth from a URL's userinfo. Connections are
pooled by origin (scheme, host, port), kept after a response that allows it (HTTP/1.1 without
`Connection: close`, HTTP/1.0 with `Connection: keep-alive`) and reused for the next request;
a kept connection the server has closed is not reused, and a request on one that fails before
any byte of the answer arrives is sent once more on a new connection, as a GET may be. Any
failure or cancellation (a scrape's timeout) closes the connection it was using. Redirects are
not followed. Failures are `FetchError`s whose class names say what failed, as httpx's do
(`ConnectError`, `ReadError`, `RemoteProtocolError`, `DecodingError`), and a body past the
size limit is a `PageTooLargeError`, found while it streams in.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import unquote, urlsplit
from urllib.request import getproxies_environment, proxy_bypass

MAX_HEAD_BYTES: Final = 64 * 1024
USER_AGENT: Final = "servewatch"
_CHUNK_LINE_END = b"\n"


class FetchError(Exception):
    """A request that got no usable answer; the class name says which step failed."""


class ConnectError(FetchError):
    """The connection could not be made (refused, unreachable, name unknown, TLS)."""


class ReadError(FetchError):
    """The connection ended or broke before the whole answer arrived."""


class RemoteProtocolError(FetchError):
    """The answer is not HTTP/1.x as spoken."""


class DecodingError(FetchError):
    """The body does not decode under its `Content-Encoding`."""


class PageTooLargeError(FetchError):
    """The body (after decoding) is larger than the limit."""


def _streamed_past(limit: int) -> PageTooLargeError:
    return PageTooLargeError(f"page exceeds the limit of {limit} bytes; the rest was not read")


@dataclass(frozen=True, slots=True)
class FetchedPage:
    """An answer: its status and content type, and for a 200 its decoded body. The body is a
    view on the received bytes (no copy); turn it into text or bytes before the next request
    on the same client."""

    status: int
    content_type: str
    body: memoryview | None


@dataclass(frozen=True, slots=True)
class _Origin:
    scheme: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class _Request:
    origin: _Origin
    data: bytes


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: received bytes gather in `buffer`; `wait` sleeps until
    more arrive or the peer has closed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False
        self.lost: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport instances, only alike.
        self.transport = cast("asyncio.Transport", transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until more bytes arrive; ReadError if the peer has closed instead."""
        if self.closed:
            cause = f": {self.lost}" if self.lost else ""
            raise ReadError(f"the server closed the connection{cause}")
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def environment_proxy() -> Callable[[str], str | None]:
    """The proxy the environment (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`, ...) names for a
    URL, as httpx would use it; read once, when called."""
    proxies = getproxies_environment()
    if not proxies:
        return lambda _url: None

    def proxy_for(url: str) -> str | None:
        parts = urlsplit(url)
        proxy = proxies.get(parts.scheme.lower()) or proxies.get("all")
        if proxy is None or proxy_bypass(parts.netloc):
            return None
        return proxy

    return proxy_for


class PageClient:
    """Pages over HTTP/1.1, a pool of kept-alive connections per origin. Safe for concurrent
    requests on one event loop (each takes a connection of its own); not across threads.
    `proxy_for(url)` names a proxy for a URL the environment sends through one (then the
    caller fetches it another way); by default none."""

    def __init__(
        self,
        *,
        tls: ssl.SSLContext | Callable[[], ssl.SSLContext] | None = None,
        proxy_for: Callable[[str], str | None] = lambda _url: None,
    ) -> None:
        self._tls = tls
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._requests: dict[tuple[str, str], _Request] = {}
        self.proxy_for = proxy_for

    async def __aenter__(self) -> PageClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    async def get(self, url: str, *, accept: str, max_body_bytes: int) -> FetchedPage:
        """GET `url`. A status other than 200 comes back without its body (that connection
        is closed); a 200's body is read while it streams, up to `max_body_bytes` decoded."""
        request = self._requests.get((url, accept))
        if request is None:
            request = self._requests[url, accept] = _request(url, accept)
        connection = self._idle_connection(request.origin)
        if connection is not None:
            try:
                return await self._exchange(connection, request, max_body_bytes)
            except ReadError:
                if connection.buffer:  # the answer had begun: not a stale connection
                    raise
            # A kept connection the server closed as the request went out: once more, anew.
        connection = await self._connect(request.origin)
        return await self._exchange(connection, request, max_body_bytes)

    def _idle_connection(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed and not connection.buffer:
                return connection
            connection.close()
        return None

    def tls_context(self) -> ssl.SSLContext:
        """The TLS context `https` targets are verified with."""
        tls = self._tls() if callable(self._tls) else self._tls
        return tls or ssl.create_default_context()

    async def _connect(self, origin: _Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self.tls_context() if origin.scheme == "https" else None
        try:
            transport, connection = await loop.create_connection(
                lambda: _Connection(loop),
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls is not None else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        # uvloop may call connection_made after create_connection has returned.
        connection.transport = transport
        return connection

    async def _exchange(
        self, connection: _Connection, request: _Request, limit: int
    ) -> FetchedPage:
        try:
            assert connection.transport is not None
            connection.transport.write(request.data)
            page, reusable = await _answer(connection, limit)
        except BaseException:
            connection.close()
            raise
        if reusable and not connection.closed:
            self._idle.setdefault(request.origin, []).append(connection)
        else:
            connection.close()
        return page


def _request(url: str, accept: str) -> _Request:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ConnectError(f"not an http(s) URL: {url}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError as exc:
        raise ConnectError(f"{exc} in {url}") from exc
    host = parts.hostname
    default = port == (443 if scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    authority = shown if default else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"GET {target} HTTP/1.1",
        f"Host: {authority}",
        f"Accept: {accept}",
        "Accept-Encoding: gzip, deflate",
        f"User-Agent: {USER_AGENT}",
    ]
    if parts.username is not None:
        user = unquote(parts.username)
        password = unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        lines.append(f"Authorization: Basic {token}")
    head = "\r\n".join(lines) + "\r\n\r\n"
    return _Request(_Origin(scheme, host, port), head.encode("latin-1"))


@dataclass(frozen=True, slots=True)
class _Head:
    status: int
    keep_alive: bool
    headers: dict[str, str]
    end: int  # where the body starts in the buffer


async def _answer(connection: _Connection, limit: int) -> tuple[FetchedPage, bool]:
    """The answer to the request just sent, and whether the connection may be reused."""
    head = await _head(connection)
    while 100 <= head.status < 200 and head.status != 101:  # interim answers: skipped
        del connection.buffer[: head.end]
        head = await _head(connection)
    content_type = head.headers.get("content-type", "")
    if head.status != 200:
        return FetchedPage(head.status, content_type, None), False
    encoding = head.headers.get("content-encoding", "identity").strip().lower()
    transfer = head.headers.get("transfer-encoding", "").lower()
    length = head.headers.get("content-length")
    if "chunked" in transfer:
        raw = await _chunked(connection, head.end, limit)
        reusable = head.keep_alive
    elif length is not None:
        size = _content_length(length)
        if encoding == "identity" and size > limit:
            raise PageTooLargeError(f"page of {size} bytes exceeds the limit of {limit}")
        raw = await _sized(connection, head.end, size, limit)
        reusable = head.keep_alive
    else:
        raw = await _until_closed(connection, head.end, limit)
        reusable = False
    body = raw if encoding == "identity" else _decoded(raw, encoding, limit)
    return FetchedPage(200, content_type, body), reusable and not connection.buffer


async def _head(connection: _Connection) -> _Head:
    scanned = 0
    while (found := _head_end(connection.buffer, max(0, scanned - 3))) is None:
        scanned = len(connection.buffer)
        if scanned > MAX_HEAD_BYTES:
            raise RemoteProtocolError(f"the answer's head exceeds {MAX_HEAD_BYTES} bytes")
        await connection.wait()
    head_end, body_start = found
    lines = connection.buffer[:head_end].decode("latin-1").splitlines()
    status_line = lines[0] if lines else ""
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if version not in ("HTTP/1.1", "HTTP/1.0") or not (code.isdigit() and len(code) == 3):
        raise RemoteProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise RemoteProtocolError(f"malformed header line: {line[:80]!r}")
        name = name.lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
    keep_alive = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
    return _Head(int(code), keep_alive, headers, body_start)


def _head_end(buffer: bytearray, start: int) -> tuple[int, int] | None:
    """Where the head ends and the body starts: at the first empty line, its lines ended by
    CRLF or (tolerated) a bare LF. Searched with `find` over the head's bytes only, never
    the body's (a regular expression would walk every line of the page)."""
    stop = min(len(buffer), MAX_HEAD_BYTES + 4)
    crlf = buffer.find(b"\r\n\r\n", start, stop)
    lf = buffer.find(b"\n\n", start, stop if crlf < 0 else crlf)
    if lf >= 0 and (crlf < 0 or lf < crlf):
        mixed = lf > 0 and buffer[lf - 1 : lf] == b"\r"  # CRLF then LF: still the first blank
        return (lf - 1 if mixed else lf), lf + 2
    return (crlf, crlf + 4) if crlf >= 0 else None


def _content_length(value: str) -> int:
    # Repeated identical values (joined with ", ") are allowed, as RFC 9110 says.
    values = {v.strip() for v in value.split(",")}
    (only,) = values if len(values) == 1 else ("",)
    if not only.isdigit():
        raise RemoteProtocolError(f"bad Content-Length: {value[:80]!r}")
    return int(only)


def _take(connection: _Connection, start: int, end: int) -> memoryview:
    """Bytes [start, end) of the buffer, which the connection gives up (no copy); the bytes
    after `end` stay as the connection's new buffer."""
    buffer = connection.buffer
    connection.buffer = bytearray(buffer[end:])
    if end < len(buffer):
        del buffer[end:]
    return memoryview(buffer)[start:end]


async def _sized(connection: _Connection, start: int, size: int, limit: int) -> memoryview:
    end = start + size
    while len(connection.buffer) < end:
        if len(connection.buffer) - start > limit:
            raise _streamed_past(limit)
        try:
            await connection.wait()
        except ReadError as exc:
            got = len(connection.buffer) - start
            raise ReadError(f"the body ended after {got} of {size} bytes") from exc
    return _take(connection, start, end)


async def _until_closed(connection: _Connection, start: int, limit: int) -> memoryview:
    while not connection.closed:
        if len(connection.buffer) - start > limit:
            raise _streamed_past(limit)
        await connection.wait()
    if connection.lost is not None:
        raise ReadError(f"the connection broke while the body streamed: {connection.lost}")
    if len(connection.buffer) - start > limit:
        raise _streamed_past(limit)
    return _take(connection, start, len(connection.buffer))


async def _chunked(connection: _Connection, start: int, limit: int) -> memoryview:
    """A chunked body's payload, chunk by chunk as it streams; trailers are read and left."""
    body = bytearray()
    at = start
    while True:
        buffer = connection.buffer
        line_end = buffer.find(_CHUNK_LINE_END, at)
        if line_end < 0:
            if len(buffer) - at > MAX_HEAD_BYTES:
                raise RemoteProtocolError("a chunk size line is too long")
            await connection.wait()
            continue
        size_text = buffer[at:line_end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise RemoteProtocolError(f"bad chunk size: {size_text[:40]!r}") from None
        if size == 0:
            return await _trailers(connection, line_end + 1, body)
        data_end = line_end + 1 + size
        while len(connection.buffer) < data_end + 2:
            if len(body) + len(connection.buffer) - line_end > limit:
                raise _streamed_past(limit)
            await connection.wait()
        buffer = connection.buffer
        body += memoryview(buffer)[line_end + 1 : data_end]
        if len(body) > limit:
            raise _streamed_past(limit)
        if buffer[data_end : data_end + 2] == b"\r\n":
            at = data_end + 2
        elif buffer[data_end : data_end + 1] == b"\n":
            at = data_end + 1
        else:
            raise RemoteProtocolError("a chunk does not end where its size says")
        del buffer[:at]  # consumed: the buffer holds only what is still to be read
        at = 0


async def _trailers(connection: _Connection, at: int, body: bytearray) -> memoryview:
    while True:
        buffer = connection.buffer
        line_end = buffer.find(_CHUNK_LINE_END, at)
        if line_end < 0:
            if len(buffer) - at > MAX_HEAD_BYTES:
                raise RemoteProtocolError("the chunked body's trailers are too long")
            await connection.wait()
            continue
        if not buffer[at:line_end].strip():
            connection.buffer = bytearray(buffer[line_end + 1 :])
            return memoryview(body)
        at = line_end + 1


def _decoded(raw: memoryview, encoding: str, limit: int) -> memoryview:
    """The body under its content encoding, given up as soon as it decodes past `limit`."""
    if encoding in ("gzip", "x-gzip"):
        wbits = [zlib.MAX_WBITS | 16]
    elif encoding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send
        wbits = [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    else:
        raise DecodingError(f"unsupported content encoding {encoding!r}")
    failure: zlib.error | None = None
    for bits in wbits:
        decoder = zlib.decompressobj(bits)
        try:
            decoded = decoder.decompress(raw, limit + 1)
        except zlib.error as exc:
            failure = failure or exc
            continue
        if len(decoded) > limit:
            raise _streamed_past(limit)
        return memoryview(decoded)
    raise DecodingError(str(failure))
