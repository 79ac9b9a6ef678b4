"""The absent-data alert of SLOs counted from metrics: Pyrra's `for`, PromQL's lookback at its
boundary, the state machine raising and resolving it, and what notifiers send for it. The
minute-by-minute agreement with promtool over a scrape gap is in
tests/test_slo_minute_agreement.py."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.slo.absent_alert import absent_for_s, is_absent_alert
from servewatch.slo.alert_state import AlertState
from servewatch.slo.alerting import replay
from servewatch.slo.counter_windows import SAMPLES_COLUMNS, present_at
from servewatch.slo.notification import ABSENT_ALERT_NAME, postable_alert, webhook_message
from servewatch.slo.spec import AvailabilitySli, SliSource, SloSpec
from servewatch.slo.windows import (
    BurnWindow,
    Severity,
    default_burn_windows,
    windows_for_period,
)

T0 = datetime(2026, 11, 18, 0, 0)
MINUTE = timedelta(minutes=1)
DAY = 86400


def metric_spec(
    objective: float, period_s: int, windows: tuple[BurnWindow, ...] | None = None
) -> SloSpec:
    rows = windows or windows_for_period(default_burn_windows(), period_s=period_s)
    return SloSpec(
        "chat",
        AvailabilitySli(SliSource.METRICS),
        objective,
        period_s,
        rows,
        labels=(("team", "infra"),),
    )


@pytest.mark.parametrize(
    ("objective", "period_s", "windows", "for_s"),
    [
        # 14.4 x 0.1 % x 1h = 51.84 s -> 51 s -> 1m
        (0.999, 30 * DAY, None, 60),
        # 14.4 x 1 % x 14m = 120.96 s -> 120 s -> 2m
        (0.99, 7 * DAY, None, 120),
        # 14.4 x 0.01 % x 1h = 5.18 s -> 0m: absent() alone, its lookback the only grace
        (0.9999, 30 * DAY, None, 0),
        # the most critical row is the highest burn, wherever it is listed, with its own for:
        # 6 x 0.1 % x 6h = 129.6 s -> 129 s, + 5m = 429 s -> 7m
        (
            0.999,
            30 * DAY,
            (
                BurnWindow(Severity.TICKET, DAY, 7200, 0.1),
                BurnWindow(Severity.PAGE, 6 * 3600, 1800, 0.05, for_s=300),
            ),
            420,
        ),
        # 90 s exactly between minutes rounds up, as Go's Duration.Round does:
        # 1 x 2.5 % x 1h = 90 s -> 2m
        (0.975, 30 * DAY, (BurnWindow(Severity.PAGE, 3600, 300, 1 / 720),), 120),
    ],
)
def test_absent_for_is_pyrras_absent_duration(
    objective: float, period_s: int, windows: tuple[BurnWindow, ...] | None, for_s: int
) -> None:
    assert absent_for_s(metric_spec(objective, period_s, windows)) == for_s


def samples(minutes: list[int], *, slo: str = "chat") -> pl.LazyFrame:
    """One total series of `slo` sampled at the given minutes after T0."""
    return pl.LazyFrame(
        {
            "series_id": [1] * len(minutes),
            "slo": [slo] * len(minutes),
            "role": ["total"] * len(minutes),
            "ts": [T0 + m * MINUTE for m in minutes],
            "value": [float(m) for m in minutes],
        }
    ).select(SAMPLES_COLUMNS)


@pytest.mark.parametrize(
    ("age", "present"),
    [
        (timedelta(0), True),
        (timedelta(minutes=4, seconds=59), True),
        # Prometheus 2.x keeps a sample exactly one lookback old
        (timedelta(minutes=5), True),
        (timedelta(minutes=5, seconds=1), False),
    ],
)
def test_a_series_is_present_within_the_lookback(age: timedelta, present: bool) -> None:
    at = T0 + 10 * MINUTE + age
    frame = present_at(samples([0, 10]), instants=[at]).collect()
    assert frame.rows() == [(at, "chat", present)]


def test_a_listed_slo_without_samples_is_absent() -> None:
    at = T0 + 10 * MINUTE
    frame = present_at(samples([10]), instants=[at], slos=["chat", "quiet"]).collect()
    assert sorted(frame.rows()) == [(at, "chat", True), (at, "quiet", False)]


def test_the_absent_alert_fires_after_its_for_and_resolves_when_samples_return() -> None:
    spec = metric_spec(0.99, 7 * DAY)  # for 2m
    end = T0 + 60 * MINUTE
    seen = [m for m in range(61) if not 20 <= m < 40]
    instants = [T0 + m * MINUTE for m in range(61)]
    presence = present_at(samples(seen), instants=instants, slos=["chat"])
    minutes = pl.LazyFrame(
        {"minute_ts": instants, "slo": ["chat"] * 61, "good": [100] * 61, "total": [100] * 61},
        schema={
            "minute_ts": pl.Datetime("us"),
            "slo": pl.String(),
            "good": pl.Int64(),
            "total": pl.Int64(),
        },
    )
    changes = replay(minutes, specs=[spec], start=T0, end=end, presence=presence)
    # Last sample at 19: still seen at 24 (5m old), absent from 25, firing 2m later.
    assert [(c.state, c.changed_ts) for c in changes] == [
        (AlertState.PENDING, T0 + 25 * MINUTE),
        (AlertState.FIRING, T0 + 27 * MINUTE),
        (AlertState.RESOLVED, T0 + 40 * MINUTE),
    ]
    assert all(is_absent_alert(c.key) for c in changes)

    firing, resolved = changes[1], changes[2]
    sent = postable_alert(firing, at=firing.changed_ts)
    assert sent["labels"] == {
        "alertname": ABSENT_ALERT_NAME,
        "slo": "chat",
        "severity": "page",
        "team": "infra",
    }
    assert sent["annotations"] == {
        "summary": "SLO chat: none of its series has a sample in the last 5m; "
        "its burn-rate alerts cannot fire without data"
    }
    assert sent["startsAt"] == "2026-11-18T00:25:00.000Z"
    assert sent["endsAt"] == "2026-11-18T00:31:00.000Z"  # four minutes ahead, re-sent
    message = webhook_message(resolved)
    assert message["status"] == "resolved"
    assert message["alerts"][0]["labels"] == sent["labels"]
    assert message["alerts"][0]["endsAt"] == "2026-11-18T00:40:00.000Z"
