"""The `run` service's local API, from the reading side: what a reading command asks the
process that holds the store.

DuckDB lets one process write a store file, or several read it, never both; while `servewatch
run` writes, a reading command asks it instead, on 127.0.0.1: a store window (`GET
/api/v1/window`, the frames the command then computes on itself) or a finished answer (`GET
/api/v1/slo`, `/alerts`, `/recommendation`, ...: the JSON document the command's `--json`
prints). A service started with an `[api] bearer_token` wants it in `Authorization: Bearer`;
the token is sent when given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from servewatch.pipeline.window import WINDOW_MEDIA_TYPE, Window, WindowQuery, window_from_bytes

API_PREFIX = "/api/v1"
WINDOW_PATH = f"{API_PREFIX}/window"
SLI_PATH = f"{API_PREFIX}/sli"
SLO_PATH = f"{API_PREFIX}/slo"
ALERTS_PATH = f"{API_PREFIX}/alerts"
HEALTH_PATH = f"{API_PREFIX}/health"
RECOMMENDATION_PATH = f"{API_PREFIX}/recommendation"
STATUS_PATH = f"{API_PREFIX}/status"
JSON_MEDIA_TYPE = "application/json"
TOKEN_ENV = "SERVEWATCH_API_TOKEN"  # noqa: S105 (the variable's name, not a token)
"""Where reading commands take the service's bearer token from."""

Params = Mapping[str, str | Sequence[str]]


class ServiceApiError(Exception):
    """The service did not answer with what was asked."""


class ServiceAnswerMissingError(ServiceApiError):
    """The service answered 404: it holds no such thing (no recommendation yet, an SLO it
    does not evaluate)."""


def _get(
    api_url: str,
    path: str,
    params: Params,
    *,
    token: str | None,
    client: httpx.Client | None,
    timeout_s: float,
) -> httpx.Response:
    url = api_url.rstrip("/") + path
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    owned = client is None
    http = client or httpx.Client(timeout=timeout_s)
    try:
        response = http.get(url, params=dict(params), headers=headers)
    except httpx.HTTPError as exc:
        raise ServiceApiError(f"the service at {api_url} did not answer: {exc}") from exc
    finally:
        if owned:
            http.close()
    if response.status_code == httpx.codes.OK:
        return response
    detail = response.text.strip().splitlines()[0] if response.text.strip() else ""
    detail = detail.removeprefix(f"{path}: ")  # the service names the path too
    if response.status_code == httpx.codes.UNAUTHORIZED:
        asked = "a wrong" if token is not None else "no"
        raise ServiceApiError(
            f"the service at {api_url} wants its bearer token ({asked} token was sent): set "
            f"{TOKEN_ENV} to the [api] bearer_token of its configuration"
        )
    message = f"the service at {api_url} answered {response.status_code} for {path}" + (
        f": {detail}" if detail else ""
    )
    if response.status_code == httpx.codes.NOT_FOUND:
        raise ServiceAnswerMissingError(message)
    raise ServiceApiError(message)


def _media_type(response: httpx.Response) -> str:
    return str(response.headers.get("content-type", "")).split(";")[0].strip()


def fetch_window(
    api_url: str,
    query: WindowQuery,
    *,
    token: str | None = None,
    client: httpx.Client | None = None,
    timeout_s: float = 120.0,
) -> Window:
    """The window `query` names, read by the service at `api_url`."""
    response = _get(
        api_url, WINDOW_PATH, query.to_params(), token=token, client=client, timeout_s=timeout_s
    )
    if _media_type(response) != WINDOW_MEDIA_TYPE:
        raise ServiceApiError(
            f"the service at {api_url} answered {response.headers.get('content-type')!r}, "
            f"not a window ({WINDOW_MEDIA_TYPE})"
        )
    try:
        return window_from_bytes(response.content)
    except ValueError as exc:
        raise ServiceApiError(f"the service at {api_url}: {exc}") from exc


def fetch_document(
    api_url: str,
    path: str,
    params: Params | None = None,
    *,
    token: str | None = None,
    client: httpx.Client | None = None,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """The JSON document the service answers at `path` (one of the `*_PATH` constants)."""
    response = _get(api_url, path, params or {}, token=token, client=client, timeout_s=timeout_s)
    if _media_type(response) != JSON_MEDIA_TYPE:
        raise ServiceApiError(
            f"the service at {api_url} answered {response.headers.get('content-type')!r} for "
            f"{path}, not {JSON_MEDIA_TYPE}"
        )
    try:
        document = json.loads(response.content)
    except ValueError as exc:
        raise ServiceApiError(f"the service at {api_url} answered {path} with bad JSON") from exc
    if not isinstance(document, dict):
        raise ServiceApiError(f"the service at {api_url} answered {path} with a non-object")
    return document
