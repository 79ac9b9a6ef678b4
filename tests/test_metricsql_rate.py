"""The MetricsQL `servewatch rules sli --dialect metricsql` writes for every rate
(`metricsql_prometheus_rate`) answers what Prometheus 2.42's `rate()` answers: the same
counter samples are written into a Prometheus (`promtool tsdb create-blocks-from
openmetrics`) and a VictoriaMetrics 1.79 (`/api/v1/import/prometheus`), and both are asked at
the same instants, for series that run through the window, start and stop inside it, start
from zero, reset, and are scraped with jitter."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import httpx
import pytest

from servewatch.slo.sli_rules import metricsql_prometheus_rate
from tests.live_prometheus import instant_query, poll, running_prometheus
from tests.live_victoria import running_victoria_metrics
from tests.test_slo_prometheus_rules import promtool

WINDOWS = {"5m": 300.0, "1m": 60.0, "20s": 20.0}
# Instants relative to T0: on a whole second (where the 10 s and 15 s series have samples on
# the window's start) and between samples.
OFFSETS_S = (0.0, 0.5, 1.25, 3.3, 7.7, -4.9, -13.1, -95.5)
TOLERANCE = 1e-6


def _series(t0: float) -> dict[str, list[tuple[float, float]]]:
    rng = random.Random(3)
    series: dict[str, list[tuple[float, float]]] = {}
    # every 15 s through every window, +3 per sample
    series["probe_a_total"] = [(t0 - 600 + 15 * i, 100.0 + 3 * i) for i in range(81)]
    # starts and stops inside the 5m window, from 5 (the time to zero caps its start)
    series["probe_b_total"] = [(t0 - 130 + 10 * i, 5.0 + 2 * i) for i in range(12)]
    # a counter reset to 1 a hundred seconds before T0
    points, value = [], 50.0
    for i in range(61):
        at = t0 - 450 + 10 * i
        if at == t0 - 100:
            value = 1.0
        points.append((at, value))
        value += rng.randint(0, 4)
    series["probe_c_total"] = points
    # 1 s scrapes with +-50 ms jitter, 13 s of them inside a 20 s window (the live tests' case)
    points, value = [], 0.0
    for i in range(14):
        points.append((round(t0 - 19.2 + i + rng.uniform(-0.05, 0.05), 3), value))
        value += rng.randint(0, 3)
    series["probe_d_total"] = points
    # starts at zero inside the window
    series["probe_e_total"] = [(t0 - 60 + 10 * i, 7.0 * i) for i in range(6)]
    # jittered 1 s scrapes through the 20 s window
    points, value = [], 10.0
    for i in range(40):
        points.append((round(t0 - 30 + i + rng.uniform(-0.05, 0.05), 3), value))
        value += rng.randint(0, 3)
    series["probe_f_total"] = points
    return series


def _value(answer: list[dict[str, object]]) -> float | None:
    if not answer:
        return None
    assert len(answer) == 1, answer
    value = answer[0]["value"]
    assert isinstance(value, list)
    return float(value[1])


@pytest.mark.slow
def test_metricsql_rate_equals_prometheus_rate(tmp_path: Path) -> None:
    t0 = float(int(time.time()) // 3600 * 3600 - 7200)
    series = _series(t0)
    openmetrics = []
    for name, points in series.items():
        openmetrics.append(f"# TYPE {name.removesuffix('_total')} counter")
        openmetrics += [f"{name} {v} {t:.3f}" for t, v in points]
    (tmp_path / "probe.om").write_text("\n".join([*openmetrics, "# EOF", ""]), encoding="utf-8")
    created = promtool(
        "tsdb", "create-blocks-from", "openmetrics", "probe.om", "data", cwd=tmp_path
    )
    assert created.returncode == 0, created.stdout + created.stderr
    lines = [f"{n} {v} {round(t * 1000)}" for n, points in series.items() for t, v in points]
    (tmp_path / "victoria").mkdir()
    with (
        running_prometheus(tmp_path, []) as prometheus,
        running_victoria_metrics(tmp_path / "victoria", []) as victoria,
    ):
        imported = victoria.post("/api/v1/import/prometheus", content="\n".join(lines) + "\n")
        assert imported.status_code == 204, imported.text
        for client in (prometheus, victoria):

            def stored(c: httpx.Client = client) -> bool | None:
                counts = [
                    _value(instant_query(c, f"count_over_time({n}[2h])", time_s=t0 + 3600))
                    for n in series
                ]
                return True if counts == [len(p) for p in series.values()] else None

            poll("every probe sample to be queryable", stored)
        compared = edges = 0
        for name, points in series.items():
            stamps = {round(t * 1000) for t, _ in points}
            for window, window_s in WINDOWS.items():
                for offset in OFFSETS_S:
                    at = t0 + offset
                    # MetricsQL's window is (t - w, t], Prometheus' [t - w, t]: a sample exactly
                    # on the window's start counts in Prometheus only (docs/promql.md).
                    if round((at - window_s) * 1000) in stamps:
                        edges += 1
                        continue
                    expected = _value(
                        instant_query(prometheus, f"rate({name}[{window}])", time_s=at)
                    )
                    expr = metricsql_prometheus_rate(name, window)
                    got = _value(_query(victoria, expr, at))
                    key = (name, window, offset, expected, got)
                    if expected is None:
                        assert got is None, key
                    else:
                        assert got is not None, key
                        assert math.isclose(got, expected, rel_tol=TOLERANCE, abs_tol=1e-12), key
                    compared += 1
    assert edges > 0  # the on-second instant does put samples on the window's start
    assert compared >= 120, compared


def _query(client: httpx.Client, expr: str, at: float) -> list[dict[str, object]]:
    """An instant query by POST: the expressions are longer than a URL likes."""
    body = client.post("/api/v1/query", data={"query": expr, "time": f"{at:.3f}"}).json()
    assert body["status"] == "success", body
    result: list[dict[str, object]] = body["data"]["result"]
    return result
