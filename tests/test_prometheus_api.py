"""The Prometheus API reader against answers shaped as Prometheus shapes them.

`FakePrometheus` is an httpx.MockTransport handler that answers the four calls the reader
makes (label values with matchers, query_range with the 5-minute lookback, instant queries of
range vectors) from a list of series, the way Prometheus 2.42 does; tests that need a broken
answer give the handler a canned response instead. The real server is in
tests/test_promql_fleet.py.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import polars as pl
import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from servewatch.collectors.prometheus.api import (
    MAX_POINTS_PER_SERIES,
    PrometheusApi,
    PrometheusApiError,
    seconds_text,
)
from servewatch.collectors.prometheus.reader import (
    ImportWindow,
    PrometheusImportReport,
    Resolution,
    import_chunks,
    import_range,
    plan_import,
    series_labels,
    target_id_of,
    to_ms,
)
from servewatch.store import Store
from tests.conftest import free_port

URL = "http://prometheus.test:9090"
LOOKBACK_MS = 300_000
T0 = datetime(2026, 11, 18, 10, 0, 0)


@dataclass(frozen=True)
class FakeSeries:
    labels: Mapping[str, str]
    samples: Sequence[tuple[int, float | None]]  # (ts_ms, value), in time order; None: stale


_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|=)\s*("(?:[^"\\]|\\.)*")\s*,?')


def parse_selector(text: str) -> tuple[list[tuple[str, str, str]], int | None]:
    """`{a="x",b=~"y"}` or `{...}[Nms]` as matchers and the range in ms (None: instant)."""
    match = re.fullmatch(r"\{(.*)\}(?:\[(\d+)ms\])?", text.strip())
    assert match is not None, f"the fake reads selectors only, got {text!r}"
    body, range_ms = match.group(1), match.group(2)
    matchers = []
    pos = 0
    while pos < len(body):
        m = _MATCHER.match(body, pos)
        assert m is not None, f"bad matcher at {body[pos:]!r}"
        matchers.append((m.group(1), m.group(2), json.loads(m.group(3))))
        pos = m.end()
    return matchers, None if range_ms is None else int(range_ms)


def matches(labels: Mapping[str, str], matchers: Sequence[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        actual = labels.get(name, "")
        if op == "=" and actual != value:
            return False
        if op == "!=" and actual == value:
            return False
        if op == "=~" and re.fullmatch(value, actual) is None:
            return False
    return True


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def success(data: object, status: int = 200) -> httpx.Response:
    return httpx.Response(status, json={"status": "success", "data": data})


class FakePrometheus:
    """A Prometheus HTTP API over fixed series; `overrides` answers chosen queries otherwise."""

    def __init__(self, series: Sequence[FakeSeries]) -> None:
        self.series = list(series)
        self.requests: list[httpx.Request] = []
        self.overrides: dict[str, Callable[[httpx.Request], httpx.Response]] = {}

    def client(self) -> httpx.Client:
        return httpx.Client(transport=httpx.MockTransport(self))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "POST":
            form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        else:
            form = {k: v[0] for k, v in parse_qs(request.url.query.decode()).items()}
        query = form.get("query", "")
        if query in self.overrides:
            return self.overrides[query](request)
        path = request.url.path
        if path.startswith("/api/v1/label/"):
            label = path.split("/")[4]
            selectors = parse_qs(request.url.query.decode()).get("match[]", ["{}"])
            found = {
                s.labels[label]
                for s in self.series
                if label in s.labels
                and any(matches(s.labels, parse_selector(sel)[0]) for sel in selectors)
            }
            return success(sorted(found))
        matchers, range_ms = parse_selector(query)
        chosen = [s for s in self.series if matches(s.labels, matchers)]
        result: list[dict[str, object]] = []
        if path == "/api/v1/query_range":
            start, end, step = (round(float(form[k]) * 1000) for k in ("start", "end", "step"))
            for s in chosen:
                values: list[list[object]] = []
                for t in range(start, end + 1, step):
                    before = [v for ts, v in s.samples if t - LOOKBACK_MS < ts <= t]
                    # A staleness marker ends the series until its next sample.
                    if before and before[-1] is not None:
                        values.append([t / 1000, format_value(before[-1])])
                if values:
                    result.append({"metric": dict(s.labels), "values": values})
            return success({"resultType": "matrix", "result": result})
        assert path == "/api/v1/query"
        assert range_ms is not None
        at = round(float(form["time"]) * 1000)
        for s in chosen:
            values = [
                [ts / 1000, format_value(v)]
                for ts, v in s.samples
                if at - range_ms <= ts <= at and v is not None
            ]
            if values:
                result.append({"metric": dict(s.labels), "values": values})
        return success({"resultType": "matrix", "result": result})


def ms(offset_s: float) -> int:
    return to_ms(T0) + round(offset_s * 1000)


VLLM0 = {"job": "vllm", "instance": "10.0.0.1:8000", "replica": "vllm-0", "host": "h-0"}
VLLM1 = {"job": "vllm", "instance": "10.0.0.2:8000", "replica": "vllm-1", "host": "h-1"}
DCGM0 = {"job": "dcgm", "instance": "10.0.0.1:9400", "host": "h-0", "zone": "z-a"}
ENGINE = {"engine": "0", "model_name": "llama"}


def counter(labels: Mapping[str, str], name: str, values: Sequence[float | None]) -> FakeSeries:
    return FakeSeries(
        {"__name__": name, **labels, **ENGINE},
        [(ms(15 * i), v) for i, v in enumerate(values)],
    )


def fleet_series() -> list[FakeSeries]:
    """Two replicas (one spelling `vllm_`), a GPU exporter with a legacy MiB field, a family
    no catalogue knows, a Prometheus-side series and an `up` with one failed scrape."""
    n = 9
    return [
        counter(VLLM0, "vllm:generation_tokens_total", [100.0 * i for i in range(n)]),
        # vllm-1 misses the scrape at 60 s: Prometheus marks its series stale, up says 0.
        counter(
            VLLM1, "vllm_generation_tokens_total", [None if i == 4 else 50.0 * i for i in range(n)]
        ),
        counter(VLLM0, "vllm:num_requests_running", [float(i % 3) for i in range(n)]),
        FakeSeries(
            {"__name__": "DCGM_FI_DEV_FB_USED", **DCGM0, "gpu": "0", "UUID": "GPU-1"},
            [(ms(15 * i), 1024.0) for i in range(n)],
        ),
        counter(VLLM0, "python_gc_objects_collected_total", [1.0] * n),
        FakeSeries({"__name__": "prometheus_tsdb_head_series", "job": "prometheus"}, [(ms(0), 1)]),
        FakeSeries({"__name__": "up", **VLLM0}, [(ms(15 * i), 1.0) for i in range(n)]),
        FakeSeries(
            {"__name__": "up", **VLLM1}, [(ms(15 * i), 0.0 if i == 4 else 1.0) for i in range(n)]
        ),
        FakeSeries({"__name__": "up", **DCGM0}, [(ms(15 * i), 1.0) for i in range(n)]),
    ]


def window(**changes: object) -> ImportWindow:
    # The cases below were written for step instants, whose query_range the fake answers as
    # Prometheus does; raw reads (the default) have cases of their own.
    spec: dict[str, object] = {
        "start": T0,
        "end": T0 + timedelta(seconds=135),
        "step_s": 15.0,
        "resolution": Resolution.STEP,
    }
    spec.update(changes)
    return ImportWindow(**spec)  # type: ignore[arg-type]


def run_import(
    fake: FakePrometheus, store: Store, *, keep: bool = False, **changes: object
) -> PrometheusImportReport:
    with fake.client() as client:
        api = PrometheusApi(client, URL)
        plan = plan_import(api, window=window(**changes), keep_uncatalogued=keep)
        return import_range(api, store=store, plan=plan, keep_uncatalogued=keep)


def tables(store: Store) -> dict[str, pl.DataFrame]:
    return {
        "targets": store.read_targets().collect(),
        "scrapes": store.read_scrapes().collect(),
        "series": store.read_series().collect(),
        "points": store.read_points().collect(),
        "unknown": store.read_unknown_families().collect(),
        "errors": store.read_ingest_errors().collect().drop("recorded_ts"),
    }


def stored_points(store: Store) -> pl.DataFrame:
    return (
        store.read_points()
        .join(store.read_series(), on="series_id")
        .join(store.read_targets().select("target_id", "replica"), on="target_id")
        .collect()
    )


# -- the API client ----------------------------------------------------------------------------


def matrix_answer(values: list[list[object]]) -> Callable[[httpx.Request], httpx.Response]:
    result = [{"metric": {"__name__": "x", "job": "j"}, "values": values}]
    return lambda _: success({"resultType": "matrix", "result": result})


def test_values_nan_and_infinities_are_read_as_floats() -> None:
    fake = FakePrometheus([])
    fake.overrides["x"] = matrix_answer(
        [[1.5, "1"], [3, "NaN"], [4.25, "+Inf"], [5, "-Inf"], [6.001, "1e-3"]]
    )
    with fake.client() as client:
        matrix = PrometheusApi(client, URL).query_range("x", start_ms=0, end_ms=10, step_ms=1)
    (series,) = matrix.series
    assert series.timestamps_ms == (1500, 3000, 4250, 5000, 6001)
    assert series.values[0] == 1.0
    assert math.isnan(series.values[1])
    assert series.values[2:] == (math.inf, -math.inf, 0.001)
    assert matrix.problems == ()


def test_time_and_step_cross_the_api_as_exact_seconds_text() -> None:
    assert seconds_text(1_795_000_000_123) == "1795000000.123"
    assert seconds_text(15_000) == "15.000"
    assert seconds_text(-1) == "-0.001"
    fake = FakePrometheus([])
    fake.overrides["x"] = matrix_answer([])
    with fake.client() as client:
        PrometheusApi(client, URL).query_range(
            "x", start_ms=1_795_000_000_123, end_ms=1_795_000_015_123, step_ms=15_000
        )
    form = parse_qs(fake.requests[0].content.decode())
    assert form["start"] == ["1795000000.123"]
    assert form["step"] == ["15.000"]


def _error_json(status: int, error_type: str, error: str) -> httpx.Response:
    return httpx.Response(status, json={"status": "error", "errorType": error_type, "error": error})


def _raise(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


BAD_ANSWERS: list[tuple[str, Callable[[httpx.Request], httpx.Response], str]] = [
    (
        "error json",
        lambda _: _error_json(400, "bad_data", 'parse error: unexpected "}"'),
        'HTTP 400: Prometheus answered bad_data: parse error: unexpected "}"',
    ),
    (
        "timeout from the server",
        lambda _: _error_json(503, "timeout", "query timed out in expression evaluation"),
        "HTTP 503: Prometheus answered timeout",
    ),
    (
        "http 500 with a text body",
        lambda _: httpx.Response(500, text="upstream exploded"),
        "HTTP 500: the body is not Prometheus API JSON: 'upstream exploded'",
    ),
    (
        "garbage with 200",
        lambda _: httpx.Response(200, content=b"<html>login</html>"),
        "HTTP 200 but: the body is not Prometheus API JSON",
    ),
    (
        "json without status",
        lambda _: httpx.Response(200, json=[1, 2]),
        "expected an object with status and data",
    ),
    (
        "a vector, not a matrix",
        lambda _: success({"resultType": "vector", "result": []}),
        "expected a matrix result, got 'vector'; a range-vector selector",
    ),
    (
        "result not a list",
        lambda _: success({"resultType": "matrix", "result": {"a": 1}}),
        "matrix result is not a list",
    ),
    (
        "client timeout",
        _raise(httpx.ReadTimeout("timed out")),
        "no answer within 60 s (ReadTimeout)",
    ),
    ("refused", _raise(httpx.ConnectError("refused")), "cannot reach the server: ConnectError"),
]


@pytest.mark.parametrize(
    ("answer", "expected"), [(a, e) for _, a, e in BAD_ANSWERS], ids=[c for c, _, _ in BAD_ANSWERS]
)
def test_bad_answers_raise_naming_url_query_and_what_was_wrong(
    answer: Callable[[httpx.Request], httpx.Response], expected: str
) -> None:
    fake = FakePrometheus([])
    fake.overrides['{__name__="x"}'] = answer
    with fake.client() as client, pytest.raises(PrometheusApiError) as caught:
        PrometheusApi(client, URL).query_range('{__name__="x"}', start_ms=0, end_ms=1, step_ms=1)
    message = str(caught.value)
    assert message.startswith(f'{URL}/api/v1/query_range (query {{__name__="x"}}): ')
    assert expected in message
    assert caught.value.query == '{__name__="x"}'


def test_malformed_series_and_points_are_left_out_and_named_the_rest_kept() -> None:
    fake = FakePrometheus([])
    result = [
        {"metric": {"__name__": "x", "i": "good"}, "values": [[1, "1"], [2, "2"]]},
        {"metric": {"__name__": "x", "i": "bad point"}, "values": [[1, "1"], [2, "lots"], [3]]},
        {"metric": ["not", "an", "object"], "values": [[1, "1"]]},
        {"metric": {"__name__": "x"}, "values": "1,2,3"},
        "garbage",
    ]
    fake.overrides["x"] = lambda _: httpx.Response(
        200,
        json={
            "status": "success",
            "warnings": ["partial response: store 2 unavailable"],
            "data": {"resultType": "matrix", "result": result},
        },
    )
    with fake.client() as client:
        matrix = PrometheusApi(client, URL).query_range("x", start_ms=0, end_ms=3, step_ms=1)
    assert [dict(s.labels)["i"] for s in matrix.series] == ["good", "bad point"]
    assert matrix.series[1].values == (1.0,)
    problems = [str(p) for p in matrix.problems]
    assert problems[0] == "x warnings[0]: the server warns: partial response: store 2 unavailable"
    assert problems[1].startswith('x result[1]: x{i="bad point"}: 2 point(s) left out')
    assert problems[1].endswith("first [2, 'lots']")
    assert problems[2].startswith("x result[2]: metric must be an object of string labels")
    assert problems[3].startswith("x result[3]: values must be a list")
    assert problems[4].startswith("x result[4]: expected an object")


def test_a_range_query_beyond_the_point_limit_is_refused_before_it_is_sent() -> None:
    fake = FakePrometheus([])
    with fake.client() as client, pytest.raises(ValueError, match="11000 points per series"):
        PrometheusApi(client, URL).query_range(
            "x", start_ms=0, end_ms=(MAX_POINTS_PER_SERIES + 1) * 1000, step_ms=1000
        )
    assert fake.requests == []


# -- chunks, targets and labels ----------------------------------------------------------------


@pytest.mark.parametrize("resolution", list(Resolution))
@pytest.mark.parametrize(("offset_ms", "length_s", "chunk_points"), [(0, 3600, 100), (7, 61, 2)])
def test_chunks_cover_the_window_without_overlap_within_the_point_limit(
    resolution: Resolution, offset_ms: int, length_s: int, chunk_points: int
) -> None:
    start = T0 + timedelta(milliseconds=offset_ms)
    spec = ImportWindow(
        start=start,
        end=start + timedelta(seconds=length_s),
        step_s=15.0,
        resolution=resolution,
        chunk_points=chunk_points,
    )
    chunks = import_chunks(spec)
    for before, after in itertools.pairwise(chunks):
        assert before.end_ms == after.start_ms
    assert chunks[-1].end_ms == spec.end_ms
    if resolution is Resolution.RAW:
        assert chunks[0].start_ms == spec.start_ms
        return
    instants = [t for c in chunks for t in range(c.start_ms, c.last_instant_ms(15_000) + 1, 15_000)]
    expected = [t for t in range(spec.start_ms, spec.end_ms) if t % 15_000 == 0]
    assert instants == expected
    assert all(len(range(c.start_ms, c.end_ms, 15_000)) <= chunk_points for c in chunks)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"end": T0}, "must be after the start"),
        ({"step_s": 0.0}, "positive whole number of milliseconds"),
        ({"step_s": 0.0005}, "positive whole number of milliseconds"),
        ({"chunk_points": 11_001}, "chunk_points must be in 1-11000"),
        ({"chunk_points": 0}, "chunk_points must be in 1-11000"),
    ],
)
def test_bad_windows_are_refused_saying_what_is_allowed(
    changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        window(**changes)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"job": "vllm", "instance": "10.0.0.1:8000"}, "http://10.0.0.1:8000/metrics"),
        ({"job": "vllm", "instance": "[::1]:8000"}, "http://[::1]:8000/metrics"),
        ({"job": "v", "instance": "https://a.example/m"}, "https://a.example/m"),
        ({"job": "vllm", "instance": "pod-7"}, "prometheus://vllm/pod-7"),
        ({"job": "federated"}, "prometheus://federated/"),
        ({"__name__": "x"}, None),
    ],
)
def test_targets_are_named_as_a_scrape_of_them_would_be(
    labels: dict[str, str], expected: str | None
) -> None:
    assert target_id_of(labels) == expected


def test_series_labels_leave_out_what_names_the_target() -> None:
    labels = {
        "__name__": "vllm:x_total",
        "job": "vllm",
        "instance": "a:1",
        "kind": "vllm",
        "replica": "r",
        "host": "h",
        "zone": "z",
        "model": "m",
        "pool": "p",
        "gpus": "2",
        "model_name": "llama",
        "engine": "0",
        "empty": "",
    }
    assert series_labels(labels) == '{"engine":"0","model_name":"llama"}'


# -- imports into the store --------------------------------------------------------------------


def test_import_stores_catalogued_families_as_a_scrape_would(store: Store) -> None:
    fake = FakePrometheus(fleet_series())
    report = run_import(fake, store)
    assert report.names == [
        "DCGM_FI_DEV_FB_USED",
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "vllm_generation_tokens_total",
    ]
    got = tables(store)
    targets = got["targets"]
    assert targets.select("target_id", "kind", "replica", "host", "zone").rows() == [
        ("http://10.0.0.1:8000/metrics", "vllm", "vllm-0", "h-0", None),
        ("http://10.0.0.1:9400/metrics", "dcgm", None, "h-0", "z-a"),
        ("http://10.0.0.2:8000/metrics", "vllm", "vllm-1", "h-1", None),
    ]
    assert targets["first_seen_ts"].to_list() == [T0] * 3
    assert targets["last_seen_ts"].to_list() == [T0 + timedelta(seconds=120)] * 3
    series = got["series"]
    assert set(series["metric"]) == {
        "vllm:generation_tokens_total",
        "vllm:num_requests_running",
        "DCGM_FI_DEV_FB_USED_BYTES",
    }
    vllm_labels = series.filter(pl.col("metric") != "DCGM_FI_DEV_FB_USED_BYTES")["labels"]
    assert set(vllm_labels) == {'{"engine":"0","model_name":"llama"}'}
    points = stored_points(store)
    tokens = points.filter(pl.col("metric") == "vllm:generation_tokens_total")
    by_replica = {
        r: tokens.filter(pl.col("replica") == r).sort("ts")["value"].to_list()
        for r in ("vllm-0", "vllm-1")
    }
    assert by_replica["vllm-0"] == [100.0 * i for i in range(9)]
    assert by_replica["vllm-1"] == [50.0 * i for i in range(9) if i != 4]
    fb = points.filter(pl.col("metric") == "DCGM_FI_DEV_FB_USED_BYTES")["value"]
    assert fb.to_list() == [1024.0 * 1024 * 1024] * 9  # MiB read as bytes
    scrapes = got["scrapes"]
    assert scrapes.height == 27
    (failed,) = scrapes.filter(~pl.col("ok")).rows(named=True)
    assert failed["target_id"] == "http://10.0.0.2:8000/metrics"
    assert failed["ts"] == T0 + timedelta(seconds=60)
    assert "up == 0" in failed["error"]
    assert failed["samples"] == 0
    assert report.failed_scrapes == 1
    assert got["unknown"].height == 0
    # Uncatalogued families are not even read.
    assert not any("python_gc" in r.content.decode() for r in fake.requests)


def test_importing_the_same_range_twice_leaves_identical_tables(store: Store) -> None:
    fake = FakePrometheus(fleet_series())
    first = run_import(fake, store, keep=True)
    before = tables(store)
    again = run_import(fake, store, keep=True)
    after = tables(store)
    for name, frame in before.items():
        assert frame.equals(after[name]), name
    assert first.new_points > 0
    assert (again.new_scrapes, again.new_points) == (0, 0)
    # An overlapping later range adds only what is new.
    later = run_import(fake, store, start=T0 + timedelta(seconds=60), end=T0 + timedelta(hours=1))
    assert later.new_scrapes > 0
    points = store.read_points().collect()
    assert points.select("series_id", "ts").is_duplicated().sum() == 0


def test_keep_all_imports_the_other_families_of_the_same_jobs_only(store: Store) -> None:
    fake = FakePrometheus(fleet_series())
    report = run_import(fake, store, keep=True)
    assert report.extra_names == ["python_gc_objects_collected_total"]
    series = store.read_series().collect()
    gc = series.filter(pl.col("metric") == "python_gc_objects_collected_total")
    assert gc.height == 1
    assert gc["signal"].to_list() == [None]
    unknown = store.read_unknown_families().collect()
    assert unknown.select("family", "samples").rows() == [("python_gc_objects_collected", 9)]
    assert "prometheus_tsdb_head_series" not in set(series["metric"])
    assert "up" not in set(series["metric"])


def test_an_import_window_reads_raw_samples_unless_told_otherwise() -> None:
    assert ImportWindow(start=T0, end=T0 + timedelta(minutes=1)).resolution is Resolution.RAW


@pytest.mark.parametrize("resolution", [Resolution.RAW, None], ids=["raw", "default"])
def test_raw_import_stores_the_samples_at_their_own_times(
    store: Store, resolution: Resolution | None
) -> None:
    samples = [(ms(7.5 + 10 * i), float(i)) for i in range(12)]  # off any step grid
    fake = FakePrometheus(
        [
            FakeSeries({"__name__": "vllm:request_success_total", **VLLM0}, samples),
            FakeSeries({"__name__": "up", **VLLM0}, [(ts, 1.0) for ts, _ in samples]),
        ]
    )
    chosen = {} if resolution is None else {"resolution": resolution}
    spec = {"start": T0, "end": T0 + timedelta(seconds=135), "step_s": 10.0, "chunk_points": 3}
    with fake.client() as client:
        api = PrometheusApi(client, URL)
        plan = plan_import(api, window=ImportWindow(**spec, **chosen))  # type: ignore[arg-type]
        report = import_range(api, store=store, plan=plan)
    points = store.read_points().collect()
    assert [to_ms(ts) for ts in points["ts"]] == [ts for ts, _ in samples]
    assert points["value"].to_list() == [float(i) for i in range(12)]
    assert report.chunks == 5  # 135 s in 30 s chunks
    # Each chunk asked for its own span and one millisecond more, evaluated at its end.
    raw_queries = [parse_qs(r.content.decode()) for r in fake.requests if r.method == "POST"]
    assert raw_queries[0]["query"] == ['{__name__="vllm:request_success_total"}[30001ms]']


def test_unusable_series_are_recorded_in_ingest_errors_and_the_rest_stored(
    store: Store,
) -> None:
    fake = FakePrometheus(fleet_series())
    selector = '{__name__="vllm:num_requests_running"}'
    fake.overrides[selector] = lambda _: success(
        {
            "resultType": "matrix",
            "result": [
                {"metric": {"__name__": "vllm:num_requests_running"} | VLLM0, "values": [[0, "x"]]}
            ],
        }
    )
    report = run_import(fake, store)
    (problem,) = report.problems
    assert problem.source == URL
    assert selector + " result[0]" in problem.location
    assert "1 point(s) left out" in problem.message
    errors = store.read_ingest_errors().collect()
    assert errors["location"].to_list() == [problem.location]
    assert "vllm:generation_tokens_total" in set(store.read_series().collect()["metric"])


def test_a_failed_query_stops_the_import_and_names_the_query(store: Store) -> None:
    fake = FakePrometheus(fleet_series())
    selector = '{__name__="vllm:num_requests_running"}'
    fake.overrides[selector] = lambda _: _error_json(
        422, "execution", "query processing would load too many samples"
    )
    with pytest.raises(PrometheusApiError, match=re.escape(f"(query {selector}): HTTP 422")):
        run_import(fake, store)


def test_a_kind_label_names_the_kind_of_a_target_no_catalogue_name_decides(
    store: Store,
) -> None:
    fake = FakePrometheus(
        [
            counter(VLLM0, "vllm:generation_tokens_total", [1.0, 2.0]),
            # A vLLM name on a target labelled dcgm: the label wins, so the DCGM catalogue
            # reads it and does not know it.
            FakeSeries(
                {"__name__": "vllm:num_requests_running", "job": "gpu", "instance": "n:1"}
                | {"kind": "dcgm"},
                [(ms(0), 40.0)],
            ),
        ]
    )
    run_import(fake, store)
    kinds = dict(store.read_targets().select("target_id", "kind").collect().rows())
    assert kinds == {"http://10.0.0.1:8000/metrics": "vllm", "http://n:1/metrics": "dcgm"}
    assert set(store.read_series().collect()["metric"]) == {"vllm:generation_tokens_total"}


# -- the command -------------------------------------------------------------------------------

HOUR = ("--from", "2026-11-18T10:00:00Z", "--to", "2026-11-18T11:00:00Z")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "2026-11-18T10:00:00Z"], "needs --from and --to"),
        (["--from", "2026-11-18T10:00:00Z", "--to", "yesterday"], "--to: 'yesterday' is not"),
        (
            ["--from", "2026-11-18T10:00:00Z", "--to", "2026-11-18T09:00:00Z"],
            "must be after the start",
        ),
        (
            ["--from", "2026-11-18T10:00:00Z", "--to", "2026-11-18T11:00:00Z", "--step", "0s"],
            "is not a duration",
        ),
        (
            [*HOUR, "--raw", "--resolution", "step"],
            "--raw and --resolution step contradict each other",
        ),
        (
            [*HOUR, "--resolution", "exact"],
            "Invalid value for '--resolution'",
        ),
    ],
)
def test_import_prometheus_bad_arguments_are_usage_errors(
    tmp_path: Path, runner: CliRunner, args: list[str], message: str
) -> None:
    result = runner.invoke(
        app,
        [
            "--db",
            str(tmp_path / "s.duckdb"),
            "import",
            "prometheus",
            URL,
            "--config",
            str(tmp_path / "none.toml"),
            *args,
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())


def test_the_old_spelling_imports_too_with_a_note(tmp_path: Path, runner: CliRunner) -> None:
    """`scrape --from-prometheus URL`, as earlier versions spelled the import, still works."""
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(
        app,
        [
            "--db",
            str(tmp_path / "s.duckdb"),
            "scrape",
            "--config",
            str(tmp_path / "none.toml"),
            "--from-prometheus",
            url,
            "--from",
            "2026-11-18T10:00:00Z",
            "--to",
            "2026-11-18T11:00:00Z",
        ],
    )
    assert result.exit_code == 1  # what the import says of an unreachable server
    stderr = " ".join(result.stderr.split())
    assert "is now `servewatch import prometheus URL`" in stderr
    assert f"{url}/api/v1/label/__name__/values: cannot reach the server" in stderr


@pytest.mark.parametrize(
    ("options", "noted"),
    [([], False), (["--step", "30s"], True), (["--step", "30s", "--resolution", "step"], False)],
)
def test_a_step_alone_is_noted_to_size_the_chunks_of_a_raw_import(
    tmp_path: Path, runner: CliRunner, options: list[str], noted: bool
) -> None:
    """Before raw reads were the default, `--step` alone meant values at step instants."""
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(
        app,
        [
            "--db",
            str(tmp_path / "s.duckdb"),
            "import",
            "prometheus",
            url,
            "--config",
            str(tmp_path / "none.toml"),
            "--from",
            "2026-11-18T10:00:00Z",
            "--to",
            "2026-11-18T11:00:00Z",
            *options,
        ],
    )
    assert result.exit_code == 1  # unreachable: the options were accepted
    stderr = " ".join(result.stderr.split())
    assert ("--step sizes its chunks. Give --resolution step" in stderr) is noted


def test_import_from_an_unreachable_prometheus_fails_naming_the_url(
    tmp_path: Path, runner: CliRunner
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = runner.invoke(
        app,
        [
            "--db",
            str(tmp_path / "s.duckdb"),
            "import",
            "prometheus",
            url,
            "--config",
            str(tmp_path / "none.toml"),
            "--from",
            "2026-11-18T10:00:00Z",
            "--to",
            "2026-11-18T11:00:00Z",
        ],
    )
    assert result.exit_code == 1
    stderr = " ".join(result.stderr.split())
    assert f"{url}/api/v1/label/__name__/values: cannot reach the server" in stderr


def test_import_options_on_a_live_scrape_are_usage_errors(
    tmp_path: Path, runner: CliRunner
) -> None:
    result = runner.invoke(
        app, ["scrape", "--config", str(tmp_path / "none.toml"), "--step", "1s", "--once"]
    )
    assert result.exit_code == 2
    assert "are options of `servewatch import prometheus URL`" in " ".join(result.stderr.split())
