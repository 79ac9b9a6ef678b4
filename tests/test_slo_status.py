"""`servewatch slo status` data: budget, burn per window and alert states at an instant."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.slo.alerting import replay
from servewatch.slo.budget import budget_status
from servewatch.slo.spec import AvailabilitySli, SloSpec
from servewatch.slo.status import slo_status
from servewatch.slo.windows import default_burn_windows

T0 = datetime(2026, 11, 18, 0, 0)
SPEC = SloSpec("chat", AvailabilitySli(), 0.999, 30 * 86400, default_burn_windows())


def minutes() -> pl.LazyFrame:
    # Three hours of 1000 requests a minute; minutes 120-122 fail completely.
    return pl.LazyFrame(
        {
            "minute_ts": [T0 + timedelta(minutes=m) for m in range(180)],
            "slo": ["chat"] * 180,
            "good": [0 if 120 <= m < 123 else 1000 for m in range(180)],
            "total": [1000] * 180,
        }
    )


@pytest.mark.parametrize(
    ("offset_min", "page_state", "active"),
    [(119, "inactive", False), (125, "firing", True), (130, "resolved", False)],
)
def test_status_reports_budget_windows_and_recorded_alert_state(
    offset_min: int, page_state: str, active: bool
) -> None:
    at = T0 + timedelta(minutes=offset_min, seconds=30)
    history = replay(minutes(), specs=[SPEC], start=T0, end=T0 + timedelta(minutes=179))
    (status,) = slo_status(minutes(), specs=[SPEC], at=at, history=history)
    (budget,) = budget_status(minutes(), specs=[SPEC], at=at).collect().rows(named=True)
    assert status.at == T0 + timedelta(minutes=offset_min)
    assert (status.good, status.total) == (budget["good"], budget["total"])
    assert status.budget_consumed_ratio == budget["budget_consumed_ratio"]
    assert status.time_to_exhaustion_s == budget["time_to_exhaustion_s"]
    assert [w.window for w in status.windows] == ["5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"]
    page = next(a for a in status.alerts if a.window == "1h")
    assert (page.state, page.condition_active) == (page_state, active)
    if page_state == "firing":
        assert page.state_since == T0 + timedelta(minutes=121)
        assert page.long_burn_rate == pytest.approx(3000 / 60000 / 0.001)
    document = json.loads(json.dumps(status.to_json()))
    assert document["at"] == status.at.isoformat() + "Z"
    assert document["alerts"][0]["severity"] == "page"
