"""The `run` service's HTTP side on 127.0.0.1: `/metrics`, `/healthz`, the live page at `/`
(its charts' Vega-Lite JSON under `/charts/`) and the local API under `/api/v1/`.

With a bearer token every path but `/healthz` wants `Authorization: Bearer <token>` (401
without it; a liveness probe needs no secret). The API answers JSON, the documents the reading
commands print with `--json` (`servewatch.answers`), or a store window (`/api/v1/window`);
400 names a bad parameter and what is allowed, 404 what the service does not hold, 503 a store
that could not be read in time.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from servewatch.collectors.service_api import (
    API_PREFIX,
    JSON_MEDIA_TYPE,
    WINDOW_PATH,
)
from servewatch.collectors.store_writer import NotCommittedError
from servewatch.live_page import BuiltPage
from servewatch.pipeline.window import WINDOW_MEDIA_TYPE, WindowQuery
from servewatch.scraping import TargetHealth
from servewatch.store import StoreError

log = logging.getLogger("servewatch.run")
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
CHARTS_PREFIX = "/charts/"
SPEC_SUFFIX = ".vl.json"
# An open page reloads itself this often; it is rebuilt only when the store has moved on.
PAGE_REFRESH_S = 60

Params = dict[str, list[str]]


class ApiInputError(ValueError):
    """A request's parameters cannot be used (400)."""


class ApiMissingError(LookupError):
    """What the request asks for is not held (404)."""


@dataclass(frozen=True)
class ServiceApi:
    """What the HTTP side asks of the service: a window as bytes, a JSON answer by path (the
    path without the API prefix, e.g. "slo"), and the live page."""

    read_window: Callable[[WindowQuery], bytes]
    answer: Callable[[str, Params], dict[str, Any]]
    page: Callable[[], BuiltPage] | None = None


def serve_health(
    metrics: Any,
    health: TargetHealth,
    *,
    port: int,
    api: ServiceApi | None = None,
    bearer_token: str | None = None,
) -> ThreadingHTTPServer:
    """/metrics (`metrics.registry`) and /healthz on 127.0.0.1: 200 "ok", 200 "degraded: ..."
    while some targets are failing, 503 "no target answered: ..." while all are. With `api`,
    also the live page and the local API."""
    registry: CollectorRegistry = metrics.registry
    expected = None if bearer_token is None else f"Bearer {bearer_token}".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/healthz":
                answer = health.answer()
                self._answer(200 if answer.ok else 503, f"{answer.text}\n".encode(), TEXT)
                return
            if not self._authorized():
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="servewatch"')
                self.send_header("Content-Type", TEXT)
                body = b"missing or wrong bearer token\n"
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if url.path == "/metrics":
                self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                return
            if api is None:
                self.send_error(404)
                return
            params = parse_qs(url.query, keep_blank_values=True)
            if url.path == WINDOW_PATH:
                self._window(api.read_window, params)
            elif url.path.startswith(API_PREFIX + "/"):
                self._document(api.answer, url.path.removeprefix(API_PREFIX + "/"), params)
            elif url.path == "/" and api.page is not None:
                if (page := self._built(api.page)) is not None:
                    self._page(page)
            elif url.path.startswith(CHARTS_PREFIX) and api.page is not None:
                if (page := self._built(api.page)) is not None:
                    self._chart(page, url.path.removeprefix(CHARTS_PREFIX))
            else:
                self.send_error(404)

        def _built(self, page: Callable[[], BuiltPage]) -> BuiltPage | None:
            """The page, or None once a 503 or 500 says why it could not be built."""
            try:
                return page()
            except (StoreError, TimeoutError, NotCommittedError) as exc:
                self._answer(
                    503, f"the store could not be read for the page: {exc}\n".encode(), TEXT
                )
            except Exception as exc:
                # One failing chart must not take the API down with it: say so, log it whole.
                log.exception("building the live page failed")
                text = f"the report page could not be built: {type(exc).__name__}: {exc}\n"
                self._answer(500, text.encode(), TEXT)
            return None

        def _authorized(self) -> bool:
            if expected is None:
                return True
            sent = (self.headers.get("Authorization") or "").encode()
            return hmac.compare_digest(sent, expected)

        def _window(self, read: Callable[[WindowQuery], bytes], params: Params) -> None:
            try:
                query = WindowQuery.from_params(_single(params))
            except ValueError as exc:
                self._answer(400, f"{WINDOW_PATH}: {exc}\n".encode(), TEXT)
                return
            try:
                body = read(query)
            except (StoreError, TimeoutError, NotCommittedError) as exc:
                self._answer(503, f"{WINDOW_PATH}: {exc}\n".encode(), TEXT)
                return
            self._answer(200, body, WINDOW_MEDIA_TYPE)

        def _document(
            self, answer: Callable[[str, Params], dict[str, Any]], name: str, params: Params
        ) -> None:
            where = f"{API_PREFIX}/{name}"
            try:
                document = answer(name, params)
            except ApiInputError as exc:
                self._answer(400, f"{where}: {exc}\n".encode(), TEXT)
                return
            except ApiMissingError as exc:
                self._answer(404, f"{where}: {exc}\n".encode(), TEXT)
                return
            except (StoreError, TimeoutError, NotCommittedError) as exc:
                self._answer(503, f"{where}: {exc}\n".encode(), TEXT)
                return
            body = (json.dumps(document, indent=2, allow_nan=False) + "\n").encode()
            self._answer(200, body, JSON_MEDIA_TYPE)

        def _page(self, page: BuiltPage) -> None:
            if self.headers.get("If-None-Match") == page.etag:
                self.send_response(304)
                self.send_header("ETag", page.etag)
                self.end_headers()
                return
            self._answer(
                200,
                page.html.encode("utf-8"),
                HTML,
                headers={
                    "ETag": page.etag,
                    "Cache-Control": "no-cache",
                    "Refresh": str(PAGE_REFRESH_S),
                },
            )

        def _chart(self, page: BuiltPage, name: str) -> None:
            spec = page.specs.get(name.removesuffix(SPEC_SUFFIX))
            if not name.endswith(SPEC_SUFFIX) or spec is None:
                # PNG and SVG files are rendered by `servewatch report`, not served live.
                self._answer(
                    404, f"no chart {name}: only Vega-Lite JSON is served\n".encode(), TEXT
                )
                return
            self._answer(200, spec.encode("utf-8"), JSON_MEDIA_TYPE)

        def _answer(
            self,
            status: int,
            body: bytes,
            content_type: str,
            *,
            headers: dict[str, str] | None = None,
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def _single(params: Params) -> dict[str, str]:
    """One value per parameter (the window query's form); a repeated one is refused."""
    repeated = sorted(k for k, v in params.items() if len(v) > 1)
    if repeated:
        raise ValueError(f"parameters given more than once: {repeated}")
    return {k: v[0] for k, v in params.items()}


def one(params: Params, name: str) -> str | None:
    """The parameter's value, None when absent; ApiInputError when repeated."""
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise ApiInputError(f"{name} given {len(values)} times; give it once")
    return values[0]


def only(params: Params, allowed: Sequence[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ApiInputError(f"unknown parameters {unknown}; allowed: {sorted(allowed)}")
