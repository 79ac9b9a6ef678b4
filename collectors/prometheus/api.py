"""The Prometheus HTTP API as servewatch reads it: label values, range queries, range vectors.

Prometheus, Thanos and Mimir answer the same `/api/v1` endpoints, so one small client serves
all three. Every answer is checked before it is believed: a transport failure or timeout, an
HTTP error status, Prometheus's error JSON (`errorType`, `error`), a body that is not JSON and
a result that is not a matrix each raise `PrometheusApiError`, whose message names the URL and
the query. Inside a good answer a malformed series or point is left out and described in
`Matrix.problems`, and the rest is kept; `warnings` (a Thanos partial response, for one) are
kept there too, so an import can say its data may be incomplete.

Times cross the API as Unix seconds with millisecond digits, the resolution Prometheus keeps;
values arrive as strings, `NaN`, `+Inf` and `-Inf` included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

# Prometheus refuses a range query whose (end - start) / step exceeds this.
MAX_POINTS_PER_SERIES = 11_000
_SHOWN_BODY_CHARS = 200


class PrometheusApiError(Exception):
    """A Prometheus API call failed or answered something unusable; says what, URL and query."""

    def __init__(self, message: str, *, url: str, query: str | None = None) -> None:
        where = url if query is None else f"{url} (query {query})"
        super().__init__(f"{where}: {message}")
        self.url = url
        self.query = query


@dataclass(frozen=True)
class MatrixSeries:
    """One series of a matrix answer: its labels (`__name__` included) and its points."""

    labels: Mapping[str, str]
    timestamps_ms: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class AnswerProblem:
    """Something left out of, or warned about in, an answer: where (query and result index)
    and what."""

    location: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


@dataclass(frozen=True)
class Matrix:
    """A matrix answer: the well-formed series, and what was left out or warned about."""

    series: tuple[MatrixSeries, ...]
    problems: tuple[AnswerProblem, ...] = ()

    @property
    def points(self) -> int:
        return sum(len(s.timestamps_ms) for s in self.series)


def seconds_text(ms: int) -> str:
    """Milliseconds as the API's Unix-seconds text, exactly (no float rounding on the way)."""
    sign = "-" if ms < 0 else ""
    whole, frac = divmod(abs(ms), 1000)
    return f"{sign}{whole}.{frac:03d}"


def promql_string(text: str) -> str:
    """`text` as a double-quoted PromQL string literal (JSON's escapes are PromQL's)."""
    return orjson.dumps(text).decode()


class PrometheusApi:
    """Calls to one Prometheus-compatible server through an injected `httpx.Client`.

    `base_url` is the server's root (`http://prometheus:9090`, or a Mimir tenant's
    `.../prometheus`); `timeout_s` bounds each call and is passed on as the query timeout.
    """

    def __init__(self, client: httpx.Client, base_url: str, *, timeout_s: float = 60.0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._client = client
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def label_values(
        self, label: str, *, start_ms: int, end_ms: int, match: Sequence[str] = ()
    ) -> list[str]:
        """Values of `label` on series alive between the two times, optionally only on series
        matching any of the `match` selectors."""
        url = f"{self.base_url}/api/v1/label/{label}/values"
        params: list[tuple[str, str]] = [
            ("start", seconds_text(start_ms)),
            ("end", seconds_text(end_ms)),
            *(("match[]", selector) for selector in match),
        ]
        query = " or ".join(match) if match else None
        data, _ = self._call("GET", url, query=query, params=params)
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise PrometheusApiError(
                f"expected a list of label values, got {_shown(data)}", url=url, query=query
            )
        return list(data)

    def query_range(self, query: str, *, start_ms: int, end_ms: int, step_ms: int) -> Matrix:
        """`query` evaluated at start, start + step, ... up to end (inclusive)."""
        if step_ms <= 0:
            raise ValueError(f"step must be positive, got {step_ms} ms")
        if (end_ms - start_ms) // step_ms > MAX_POINTS_PER_SERIES:
            raise ValueError(
                f"{query}: {(end_ms - start_ms) // step_ms} steps exceed Prometheus's limit of "
                f"{MAX_POINTS_PER_SERIES} points per series; query shorter ranges"
            )
        url = f"{self.base_url}/api/v1/query_range"
        form = {
            "query": query,
            "start": seconds_text(start_ms),
            "end": seconds_text(end_ms),
            "step": seconds_text(step_ms),
            "timeout": f"{self.timeout_s:g}s",
        }
        data, warnings = self._call("POST", url, query=query, form=form)
        return _matrix(data, warnings, url=url, query=query)

    def query_matrix(self, query: str, *, time_ms: int) -> Matrix:
        """An instant query whose answer is a matrix: a range-vector selector such as
        `{__name__="x"}[5m]` gives the samples as stored, at their own timestamps."""
        url = f"{self.base_url}/api/v1/query"
        form = {"query": query, "time": seconds_text(time_ms), "timeout": f"{self.timeout_s:g}s"}
        data, warnings = self._call("POST", url, query=query, form=form)
        return _matrix(data, warnings, url=url, query=query)

    def _call(
        self,
        method: str,
        url: str,
        *,
        query: str | None,
        params: Sequence[tuple[str, str]] = (),
        form: Mapping[str, str] | None = None,
    ) -> tuple[Any, list[str]]:
        try:
            response = self._client.request(
                method, url, params=list(params), data=form, timeout=self.timeout_s
            )
        except httpx.TimeoutException as exc:
            raise PrometheusApiError(
                f"no answer within {self.timeout_s:g} s ({type(exc).__name__}); a shorter "
                "range or a larger --timeout may help",
                url=url,
                query=query,
            ) from exc
        except httpx.HTTPError as exc:
            raise PrometheusApiError(
                f"cannot reach the server: {type(exc).__name__}: {exc}", url=url, query=query
            ) from exc
        return _payload(response, url=url, query=query)


def series_text(labels: Mapping[str, str]) -> str:
    """A series as PromQL writes it: `name{label="value",...}`."""
    inner = ",".join(
        f"{k}={promql_string(v)}" for k, v in sorted(labels.items()) if k != "__name__"
    )
    return f"{labels.get('__name__', '')}{{{inner}}}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_BODY_CHARS else text[:_SHOWN_BODY_CHARS] + "..."


def _payload(response: httpx.Response, *, url: str, query: str | None) -> tuple[Any, list[str]]:
    """The `data` and `warnings` of a success answer; anything else raises with what the
    server said."""
    status = response.status_code
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError as exc:
        text = response.content[:_SHOWN_BODY_CHARS].decode("utf-8", errors="replace")
        what = f"HTTP {status}" if status != 200 else "HTTP 200 but"
        raise PrometheusApiError(
            f"{what}: the body is not Prometheus API JSON: {text!r}", url=url, query=query
        ) from exc
    if not isinstance(body, dict) or "status" not in body:
        raise PrometheusApiError(
            f"HTTP {status}: expected an object with status and data, got {_shown(body)}",
            url=url,
            query=query,
        )
    if body["status"] != "success":
        error_type = body.get("errorType", "unknown")
        error = body.get("error", "no error message")
        raise PrometheusApiError(
            f"HTTP {status}: Prometheus answered {error_type}: {error}", url=url, query=query
        )
    if status != 200:
        raise PrometheusApiError(
            f"HTTP {status} with status success, which no Prometheus sends", url=url, query=query
        )
    if "data" not in body:
        raise PrometheusApiError("status success but no data", url=url, query=query)
    warnings = body.get("warnings") or []
    return body["data"], [str(w) for w in warnings] if isinstance(warnings, list) else []


def _matrix(data: Any, warnings: Sequence[str], *, url: str, query: str) -> Matrix:
    if not isinstance(data, dict):
        raise PrometheusApiError(
            f"expected data with a result, got {_shown(data)}", url=url, query=query
        )
    result_type = data.get("resultType")
    if result_type != "matrix":
        hint = (
            "; a range-vector selector such as x[5m] gives one"
            if result_type in ("vector", "scalar")
            else ""
        )
        raise PrometheusApiError(
            f"expected a matrix result, got {result_type!r}{hint}", url=url, query=query
        )
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusApiError(
            f"matrix result is not a list: {_shown(result)}", url=url, query=query
        )
    problems = [
        AnswerProblem(f"{query} warnings[{i}]", f"the server warns: {w}")
        for i, w in enumerate(warnings)
    ]
    series: list[MatrixSeries] = []
    for index, item in enumerate(result):
        parsed, problem = _series(item)
        if problem is not None:
            problems.append(AnswerProblem(f"{query} result[{index}]", problem))
        if parsed is not None:
            series.append(parsed)
    return Matrix(series=tuple(series), problems=tuple(problems))


def _series(item: object) -> tuple[MatrixSeries | None, str | None]:
    """One result entry: the series (None when unusable) and what was wrong with it, if any."""
    if not isinstance(item, dict):
        return None, f"expected an object with metric and values, got {_shown(item)}"
    labels = item.get("metric")
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        return None, f"metric must be an object of string labels, got {_shown(labels)}"
    raw = item.get("values")
    if not isinstance(raw, list):
        return None, f"values must be a list of [time, value] pairs, got {_shown(raw)}"
    timestamps: list[int] = []
    values: list[float] = []
    bad: list[str] = []
    for pair in raw:
        try:
            ts_s, text = pair
            if not isinstance(text, str) or isinstance(ts_s, bool):
                raise TypeError
            value = float(text)
            ts_ms = round(float(ts_s) * 1000)
        except (TypeError, ValueError, OverflowError):
            bad.append(_shown(pair))
            continue
        timestamps.append(ts_ms)
        values.append(value)
    series = MatrixSeries(labels=labels, timestamps_ms=tuple(timestamps), values=tuple(values))
    if not bad:
        return series, None
    problem = (
        f"{series_text(labels)}: {len(bad)} point(s) left out, not [unix seconds, "
        f'"number"] pairs (NaN, +Inf, -Inf allowed): first {bad[0]}'
    )
    return series, problem
