"""The `run` service's local API, from the reading side: a store window asked of the process
that holds the store.

DuckDB lets one process write a store file, or several read it, never both; while `servewatch
run` writes, a reading command asks it for the window instead (`GET /api/v1/window`, answered
on 127.0.0.1 from the service's own connection).
"""

from __future__ import annotations

import httpx

from servewatch.pipeline.window import WINDOW_MEDIA_TYPE, Window, WindowQuery, window_from_bytes

WINDOW_PATH = "/api/v1/window"


class ServiceApiError(Exception):
    """The service did not answer with a window."""


def fetch_window(
    api_url: str,
    query: WindowQuery,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = 120.0,
) -> Window:
    """The window `query` names, read by the service at `api_url`."""
    url = api_url.rstrip("/") + WINDOW_PATH
    owned = client is None
    http = client or httpx.Client(timeout=timeout_s)
    try:
        response = http.get(url, params=query.to_params())
    except httpx.HTTPError as exc:
        raise ServiceApiError(f"the service at {api_url} did not answer: {exc}") from exc
    finally:
        if owned:
            http.close()
    if response.status_code != httpx.codes.OK:
        detail = response.text.strip().splitlines()[0] if response.text.strip() else ""
        raise ServiceApiError(
            f"the service at {api_url} answered {response.status_code} for {WINDOW_PATH}"
            + (f": {detail}" if detail else "")
        )
    if response.headers.get("content-type", "").split(";")[0] != WINDOW_MEDIA_TYPE:
        raise ServiceApiError(
            f"the service at {api_url} answered {response.headers.get('content-type')!r}, "
            f"not a window ({WINDOW_MEDIA_TYPE})"
        )
    try:
        return window_from_bytes(response.content)
    except ValueError as exc:
        raise ServiceApiError(f"the service at {api_url}: {exc}") from exc
