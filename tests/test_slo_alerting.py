"""Multiwindow, multi-burn-rate alerting in virtual time: detection and reset times from the
workbook, steady burns by table, the low-traffic guard, the state machine and the
every-minute step with its history and notifications."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import polars as pl
import pytest

from servewatch.slo.alert_state import (
    AlertChange,
    AlertKey,
    AlertState,
    Condition,
    InMemoryAlertStateStore,
    TableAlertStateStore,
    advance,
)
from servewatch.slo.alerting import evaluate_at, replay, step
from servewatch.slo.notification import NotificationError
from servewatch.slo.spec import AvailabilitySli, SloSpec
from servewatch.slo.windows import BurnWindow, Severity, default_burn_windows
from servewatch.store import Store

T0 = datetime(2026, 11, 18, 0, 0)
MINUTE = timedelta(minutes=1)
SCHEMA = {
    "minute_ts": pl.Datetime("us"),
    "slo": pl.String(),
    "good": pl.Int64(),
    "total": pl.Int64(),
}
RPS = 10  # requests per second, so every second of outage is exactly 10 bad events


def spec(objective: float = 0.999, *, min_events: int = 1, **kwargs: Any) -> SloSpec:
    windows = kwargs.pop("windows", default_burn_windows())
    return SloSpec("chat", AvailabilitySli(), objective, 30 * 86400, windows, min_events=min_events)


def outage_minutes(
    *, start: datetime, end: datetime, outage: tuple[datetime, datetime]
) -> pl.LazyFrame:
    """Per-minute counts of steady traffic with every request failing during `outage`."""
    rows = []
    minute = start
    while minute < end:
        lo, hi = max(minute, outage[0]), min(minute + MINUTE, outage[1])
        bad_s = max(0.0, (hi - lo).total_seconds())
        bad = round(bad_s * RPS)
        rows.append({"minute_ts": minute, "slo": "chat", "good": 60 * RPS - bad, "total": 60 * RPS})
        minute += MINUTE
    return pl.LazyFrame(rows, schema=SCHEMA)


def transitions(changes: Sequence[AlertChange], window: str) -> list[tuple[AlertState, datetime]]:
    return [(c.state, c.changed_ts) for c in changes if c.key.window == window]


# The workbook: a 100 % error ratio against 99.9 % trips the 1h/14.4 pair after
# 14.4 * 0.001 * 3600 s = 51.84 s of outage.
DETECTION_S = 14.4 * (1 - 0.999) * 3600


@pytest.mark.parametrize("start_second", [0, 30, 59])
@pytest.mark.parametrize("recover_second", [0, 45])
def test_full_outage_pages_after_52_s_and_resolves_within_the_short_window(
    start_second: int, recover_second: int
) -> None:
    outage_start = T0 + timedelta(hours=2, seconds=start_second)
    recovery = outage_start.replace(second=0) + timedelta(minutes=20, seconds=recover_second)
    end = recovery + timedelta(hours=7)
    minutes = outage_minutes(start=T0, end=end, outage=(outage_start, recovery))
    changes = replay(minutes, specs=[spec()], start=T0, end=end)

    (fired, fired_at), (resolved, resolved_at) = transitions(changes, "1h")
    assert (fired, resolved) == (AlertState.FIRING, AlertState.RESOLVED)
    detection_s = (fired_at - outage_start).total_seconds()
    assert DETECTION_S <= detection_s <= DETECTION_S + 60, detection_s  # one 1-minute interval
    for window in default_burn_windows():
        states = transitions(changes, window.long_window)
        assert [s for s, _ in states] == [AlertState.FIRING, AlertState.RESOLVED], window
        reset_s = (states[1][1] - recovery).total_seconds()
        limit_s = window.short_window_s + (0 if recover_second == 0 else 60)
        assert 0 < reset_s <= limit_s, (window, reset_s)
    assert resolved_at - recovery <= timedelta(minutes=5 if recover_second == 0 else 6)


def test_detection_is_not_early_for_a_partial_error_ratio() -> None:
    # Half the requests fail: the workbook's t = 14.4 * 0.001 * 1 h / 0.5 = 103.7 s.
    start = T0 + timedelta(hours=2)
    rows = [
        {
            "minute_ts": T0 + m * MINUTE,
            "slo": "chat",
            "good": 600 if T0 + m * MINUTE < start else 300,
            "total": 600,
        }
        for m in range(180)
    ]
    changes = replay(
        pl.LazyFrame(rows, schema=SCHEMA), specs=[spec()], start=T0, end=T0 + 180 * MINUTE
    )
    (_, fired_at), *_ = transitions(changes, "1h")
    assert 103.68 <= (fired_at - start).total_seconds() <= 103.68 + 60


def steady_burn(burn: float, *, days: float = 3.5, requests: int = 1000) -> pl.LazyFrame:
    bad = round(burn * requests * (1 - 0.999))
    count = int(days * 1440)
    return pl.LazyFrame(
        {
            "minute_ts": [T0 + m * MINUTE for m in range(count)],
            "slo": ["chat"] * count,
            "good": [requests - bad] * count,
            "total": [requests] * count,
        },
        schema=SCHEMA,
    )


@pytest.mark.parametrize(
    ("burn", "firing"),
    [
        (0.0, set()),
        (1.0, set()),  # spends exactly the budget over the period: nobody is told
        (2.0, {"3d"}),
        (5.0, {"1d", "3d"}),
        (10.0, {"6h", "1d", "3d"}),
        (15.0, {"1h", "6h", "1d", "3d"}),
    ],
)
def test_steady_burn_fires_exactly_the_pairs_it_exceeds(burn: float, firing: set[str]) -> None:
    conditions = evaluate_at(steady_burn(burn), specs=[spec()], at=T0 + timedelta(days=3.5))
    assert {c.key.window for c in conditions if c.active} == firing
    for condition in conditions:
        assert condition.long_burn_rate == pytest.approx(burn)
        assert condition.short_burn_rate == pytest.approx(burn)


def test_steady_burn_of_one_pages_nobody_at_any_minute() -> None:
    changes = replay(steady_burn(1.0), specs=[spec()], start=T0, end=T0 + timedelta(days=3.5))
    assert changes == ()


@pytest.mark.parametrize(("min_events", "pages"), [(1, True), (3, True), (10, False)])
def test_low_traffic_guard(min_events: int, pages: bool) -> None:
    # Three requests an hour, one of them failing: a burn of 333 on a handful of events.
    rows = [
        {"minute_ts": T0 + m * MINUTE, "slo": "chat", "good": 0 if m == 119 else 1, "total": 1}
        for m in range(121)
        if m % 20 == 19
    ]
    specs = [spec(min_events=min_events, windows=default_burn_windows()[:1])]
    short = [BurnWindow(Severity.PAGE, 3600, 1200, 0.02)]  # a 20 m short window sees one event
    specs.append(
        SloSpec(
            "chat-20m", AvailabilitySli(), 0.999, 30 * 86400, tuple(short), min_events=min_events
        )
    )
    frame = pl.LazyFrame(rows, schema=SCHEMA)
    frame = pl.concat([frame, frame.with_columns(slo=pl.lit("chat-20m"))])
    conditions = evaluate_at(frame, specs=specs, at=T0 + 120 * MINUTE)
    by_slo = {c.key.slo: c for c in conditions}
    assert by_slo["chat"].long_burn_rate == pytest.approx(1000 / 3)
    # 1h holds 3 events, 5m holds 1: a guard of 3 already silences the 5m pair.
    assert by_slo["chat"].active is (min_events == 1)
    assert by_slo["chat-20m"].active is (min_events == 1)
    assert pages is (min_events <= 3)


KEY = AlertKey("chat", Severity.PAGE, 3600, 300)


def condition(active: bool, *, for_s: int = 0) -> Condition:
    return Condition(
        KEY, active, 20.0 if active else 1.0, 20.0 if active else 1.0, 14.4, 0.1, for_s
    )


STATE_SEQUENCES = [
    # (for_s, condition each minute, state change each minute (None: no change))
    (0, [False, True, True, False, False], [None, "firing", None, "resolved", None]),
    (120, [True, True, True, True, False], ["pending", None, "firing", None, "resolved"]),
    (120, [True, True, False, True], ["pending", None, "inactive", "pending"]),
    (60, [True, True, False], ["pending", "firing", "resolved"]),
    (0, [True, False, True], ["firing", "resolved", "firing"]),
]


@pytest.mark.parametrize(("for_s", "active", "expected"), STATE_SEQUENCES)
def test_state_machine_by_table(for_s: int, active: list[bool], expected: list[str | None]) -> None:
    latest: dict[AlertKey, AlertChange] = {}
    seen: list[str | None] = []
    for minute, is_active in enumerate(active):
        changes = advance(latest, [condition(is_active, for_s=for_s)], at=T0 + minute * MINUTE)
        assert len(changes) <= 1
        seen.append(changes[0].state.value if changes else None)
        latest.update({c.key: c for c in changes})
    assert seen == expected


def test_firing_alert_whose_window_was_removed_resolves() -> None:
    (fired,) = advance({}, [condition(True)], at=T0)
    (gone,) = advance({KEY: fired}, [], at=T0 + MINUTE)
    assert (gone.state, gone.changed_ts, gone.active_since_ts) == (
        AlertState.RESOLVED,
        T0 + MINUTE,
        T0,
    )


@dataclass
class RecordingNotifier:
    """A Notifier that keeps what it is given (a real implementation of the protocol)."""

    calls: list[tuple[tuple[AlertChange, ...], tuple[AlertChange, ...]]] = field(
        default_factory=list
    )
    fail: bool = False

    def notify(
        self, changes: Sequence[AlertChange], *, firing: Sequence[AlertChange], at: datetime
    ) -> None:
        self.calls.append((tuple(changes), tuple(firing)))
        if self.fail:
            raise NotificationError("receiver down")


def test_step_records_each_change_once_and_notifies_per_change() -> None:
    outage = (T0 + timedelta(hours=2), T0 + timedelta(hours=2, minutes=3))
    minutes = outage_minutes(start=T0, end=T0 + timedelta(hours=3), outage=outage)
    states = InMemoryAlertStateStore()
    notifier = RecordingNotifier()
    specs = [spec()]
    for offset in range(115, 140):
        at = T0 + offset * MINUTE + timedelta(seconds=17)  # the job runs a little late
        first = step(minutes, specs=specs, at=at, states=states, notifier=notifier)
        again = step(minutes, specs=specs, at=at, states=states, notifier=notifier)
        assert again.changes == ()  # re-running the same minute changes nothing
        assert first.at == at.replace(second=0)
    page = [(c.state, c.changed_ts) for c in states.history if c.key.window == "1h"]
    assert page == [
        (AlertState.FIRING, T0 + timedelta(hours=2, minutes=1)),
        (AlertState.RESOLVED, T0 + timedelta(hours=2, minutes=8)),
    ]
    told = [c for changes, _ in notifier.calls for c in changes]
    assert told == states.history
    firing_change = next(c for c in states.history if c.key.window == "1h")
    assert firing_change.long_burn_rate == pytest.approx(1 / 60 / 0.001)
    assert firing_change.short_burn_rate == pytest.approx(1 / 5 / 0.001)
    assert firing_change.budget_consumed_ratio is not None


def test_failed_notification_is_reported_and_the_history_kept() -> None:
    minutes = outage_minutes(
        start=T0,
        end=T0 + timedelta(hours=3),
        outage=(T0 + timedelta(hours=2), T0 + timedelta(hours=3)),
    )
    states = InMemoryAlertStateStore()
    evaluation = step(
        minutes,
        specs=[spec()],
        at=T0 + timedelta(hours=2, minutes=1),
        states=states,
        notifier=RecordingNotifier(fail=True),
    )
    assert evaluation.notification_error == "receiver down"
    assert [c.state for c in states.history] == [AlertState.FIRING] * 4  # 2 h of history: all
    assert evaluation.firing == tuple(states.history)


def test_table_backed_state_store_round_trips_the_history() -> None:
    minutes = outage_minutes(
        start=T0,
        end=T0 + timedelta(hours=3),
        outage=(T0 + timedelta(hours=2), T0 + timedelta(hours=2, minutes=2)),
    )
    scoped = SloSpec(
        "chat",
        AvailabilitySli(),
        0.999,
        30 * 86400,
        default_burn_windows(),
        labels=(("team", "a"),),
    )
    with Store.open(":memory:") as store:  # the real `alerts` table
        memory, table = InMemoryAlertStateStore(), TableAlertStateStore(store)
        for offset in range(118, 135):
            at = T0 + offset * MINUTE
            step(minutes, specs=[scoped], at=at, states=memory)
            step(minutes, specs=[scoped], at=at, states=table)
            assert table.latest() == memory.latest()
        assert store.read_alert_changes().collect().height == len(memory.history)
    assert all(c.labels == (("team", "a"),) for c in memory.history)
