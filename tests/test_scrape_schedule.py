"""The scrape schedule in virtual time: stable, evenly spread offsets; slots on the grid; a slot
passed during a scrape is skipped and counted, never stacked."""

from __future__ import annotations

import re
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servewatch.collectors.scrape.schedule import (
    TargetSchedule,
    catch_up,
    lag_s,
    next_after_scrape,
    offset_s,
    schedule_for,
)
from servewatch.collectors.scrape.targets import Target, TargetKind

EPOCH_S = 1_795_046_400.0  # 2026-11-19T00:00:00Z


def target(i: int, *, interval_s: float | None = None, timeout_s: float | None = None) -> Target:
    url = f"http://10.0.{i // 250}.{i % 250}:8000/metrics"
    return Target(
        target_id=url, kind=TargetKind.VLLM, url=url, interval_s=interval_s, timeout_s=timeout_s
    )


def test_offsets_are_stable_within_the_interval_and_spread_evenly() -> None:
    offsets = [offset_s(target(i).target_id, interval_s=15) for i in range(300)]
    assert all(0 <= o < 15 for o in offsets)
    assert len(set(offsets)) == 300
    # Stable across calls (and processes: a keyed hash, not Python's salted hash()).
    assert offsets[0] == offset_s(target(0).target_id, interval_s=15)
    assert offsets[0] == pytest.approx(offset_s("http://10.0.0.0:8000/metrics", interval_s=15))
    # Evenly spread: every 1.5 s tenth of the interval holds roughly a tenth of the targets.
    tenths = [sum(1 for o in offsets if k * 1.5 <= o < (k + 1) * 1.5) for k in range(10)]
    assert min(tenths) >= 15
    assert max(tenths) <= 45
    assert statistics.mean(offsets) == pytest.approx(7.5, abs=1.0)


def test_a_seed_moves_the_offsets() -> None:
    identity = target(1).target_id
    assert offset_s(identity, interval_s=15, seed="replica-b") != offset_s(identity, interval_s=15)


def test_offsets_are_pinned_values() -> None:
    # A keyed hash, not Python's salted hash(): the same in every process. Pinned, because a
    # change of hash would move the phase of every target of every fleet on upgrade.
    assert offset_s("http://127.0.0.1:9000/metrics", interval_s=15) == 0.395357
    assert offset_s("vllm-0", interval_s=10, seed="b") == 0.547424


def test_slots_lie_on_the_target_grid() -> None:
    schedule = TargetSchedule(interval_s=15, timeout_s=10, offset_s=4.25)
    at = EPOCH_S + 100.0  # 100 = 6 * 15 + 10: the slot before is at +94.25
    assert schedule.slot_at_or_before(at) == EPOCH_S + 94.25
    assert schedule.slot_after(at) == EPOCH_S + 109.25
    assert schedule.slot_at_or_after(at) == EPOCH_S + 109.25
    assert schedule.slot_at_or_after(EPOCH_S + 94.25) == EPOCH_S + 94.25
    assert schedule.slot_after(EPOCH_S + 94.25) == EPOCH_S + 109.25
    assert schedule.slots_between(EPOCH_S + 94.25, EPOCH_S + 139.25) == 3
    assert schedule.slots_between(EPOCH_S + 94.25, EPOCH_S + 139.0) == 2
    assert schedule.slots_between(EPOCH_S + 100, EPOCH_S + 100) == 0


def test_a_scrape_that_finishes_in_time_skips_nothing() -> None:
    schedule = TargetSchedule(interval_s=15, timeout_s=10, offset_s=3)
    slot = EPOCH_S + 3
    following = next_after_scrape(schedule, slot_s=slot, finished_s=slot + 9.9)
    assert following.slot_s == slot + 15
    assert following.skipped == 0


def test_a_scrape_still_running_at_its_next_slots_skips_them() -> None:
    schedule = TargetSchedule(interval_s=5, timeout_s=5, offset_s=0)
    slot = EPOCH_S
    # Finished 0.2 s after its next slot: that slot is skipped, the one after is next.
    following = next_after_scrape(schedule, slot_s=slot, finished_s=slot + 5.2)
    assert following == type(following)(slot_s=slot + 10, skipped=1)
    # A slot at the very instant the scrape ends is still occupied.
    exact = next_after_scrape(schedule, slot_s=slot, finished_s=slot + 5)
    assert exact.slot_s == slot + 10
    assert exact.skipped == 1
    # A hung scrape (a stalled loop) past three slots: three skipped, not three stacked.
    hung = next_after_scrape(schedule, slot_s=slot, finished_s=slot + 17)
    assert hung.slot_s == slot + 20
    assert hung.skipped == 3


def test_a_late_wake_up_serves_the_latest_slot_once() -> None:
    schedule = TargetSchedule(interval_s=15, timeout_s=10, offset_s=0)
    slot = EPOCH_S
    on_time = catch_up(schedule, slot_s=slot, woke_s=slot + 0.003)
    assert on_time.slot_s == slot
    assert on_time.skipped == 0
    late = catch_up(schedule, slot_s=slot, woke_s=slot + 31)
    assert late.slot_s == slot + 30
    assert late.skipped == 2
    assert lag_s(slot_s=late.slot_s, started_s=slot + 31) == pytest.approx(1.0)
    assert lag_s(slot_s=slot, started_s=slot - 0.001) == 0.0


def test_a_target_overrides_interval_and_timeout_and_the_timeout_is_capped() -> None:
    default = schedule_for(target(1), interval_s=15, timeout_s=10)
    assert (default.interval_s, default.timeout_s) == (15, 10)
    own = schedule_for(target(1, interval_s=60.0, timeout_s=30.0), interval_s=15, timeout_s=10)
    assert (own.interval_s, own.timeout_s) == (60, 30)
    assert 0 <= own.offset_s < 60
    short = schedule_for(target(1, interval_s=5.0), interval_s=15, timeout_s=10)
    assert (short.interval_s, short.timeout_s) == (5, 5)


@pytest.mark.parametrize(
    ("interval_s", "timeout_s", "offset", "message"),
    [
        (0, 1, 0, "interval_s must be positive"),
        (15, 16, 0, "timeout_s must be positive and at most interval_s (15)"),
        (15, 0, 0, "timeout_s must be positive"),
        (15, 10, 15, "offset_s must be in [0, interval_s)"),
    ],
)
def test_invalid_schedules_are_refused(
    interval_s: float, timeout_s: float, offset: float, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TargetSchedule(interval_s=interval_s, timeout_s=timeout_s, offset_s=offset)


@given(
    interval_ms=st.integers(min_value=100, max_value=600_000),
    identity=st.text(min_size=1, max_size=40),
    t_ms=st.integers(min_value=0, max_value=10**9),
    durations_ms=st.lists(st.integers(min_value=0, max_value=2_000_000), max_size=30),
)
def test_a_simulated_target_never_overlaps_and_accounts_for_every_slot(
    interval_ms: int, identity: str, t_ms: int, durations_ms: list[int]
) -> None:
    """Drive one target through scrapes of arbitrary length in virtual time: every scrape
    starts on a slot after the previous one ended, and served plus skipped slots cover the
    whole span without a gap."""
    interval = interval_ms / 1000
    schedule = TargetSchedule(
        interval_s=interval,
        timeout_s=interval,
        offset_s=offset_s(identity, interval_s=interval),
    )
    start = EPOCH_S + t_ms / 1000
    slot = schedule.slot_at_or_after(start)
    first = slot
    served = skipped = 0
    previous_end = -1.0
    for duration_ms in durations_ms:
        assert slot > previous_end
        assert schedule.slot_at_or_before(slot) == pytest.approx(slot)
        served += 1
        previous_end = slot + duration_ms / 1000
        following = next_after_scrape(schedule, slot_s=slot, finished_s=previous_end)
        skipped += following.skipped
        slot = following.slot_s
    assert served + skipped == round((slot - first) / interval)
