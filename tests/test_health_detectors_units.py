"""Detector edge cases on small hand-built frames: episodes with noisy minutes and gaps,
ongoing versus ended, and the KV-pressure detector's positive and negative cases."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from servewatch.health.episodes import binomial_tail, episode_end, flagged_episodes, overlapping
from servewatch.health.finding import FindingKind, HealthInputs, ScopeUnit
from servewatch.health.kv_pressure import KvPressureDetector
from servewatch.pipeline.signals import Signal

T0 = datetime(2026, 11, 19)


def _minutes(flags: list[bool]) -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "replica": ["r"] * len(flags),
            "minute_ts": [T0 + timedelta(minutes=i) for i in range(len(flags))],
            "flag": flags,
        }
    )


def test_a_noisy_minute_alone_makes_no_episode() -> None:
    flags = [False] * 5 + [True] + [False] * 5
    episodes = flagged_episodes(
        _minutes(flags), by=["replica"], flag="flag", max_gap_minutes=2, min_minutes=3
    ).collect()
    assert episodes.is_empty()


def test_a_short_gap_is_bridged_and_a_long_one_splits() -> None:
    flags = [True] * 3 + [False] + [True] * 3 + [False] * 4 + [True] * 3
    episodes = flagged_episodes(
        _minutes(flags), by=["replica"], flag="flag", max_gap_minutes=2, min_minutes=3
    ).collect()
    assert episodes["start"].to_list() == [T0, T0 + timedelta(minutes=11)]
    assert episodes["end"].to_list() == [T0 + timedelta(minutes=7), T0 + timedelta(minutes=14)]
    assert episodes["flagged_minutes"].to_list() == [6, 3]


def test_an_episode_reaching_the_window_end_is_ongoing() -> None:
    end = T0 + timedelta(minutes=14)
    assert episode_end(end, window_end=end, max_gap_minutes=2) is None
    assert episode_end(end - timedelta(minutes=5), window_end=end, max_gap_minutes=2) == (
        end - timedelta(minutes=5)
    )


def test_binomial_tail() -> None:
    assert binomial_tail(0, 5, 0.3) == 1.0
    assert binomial_tail(6, 5, 0.3) == 0.0
    assert abs(binomial_tail(5, 5, 0.5) - 1 / 32) < 1e-12


def _kv_inputs(usage: list[float], preemptions_total: list[float]) -> HealthInputs:
    """One replica scraped every 15 s: KV usage gauge and the preemptions counter."""
    dimensions = pl.LazyFrame(
        {
            "series_id": [1, 2],
            "replica": ["vllm-0", "vllm-0"],
            "pool": ["p", "p"],
            "host": ["h", "h"],
            "zone": ["z", "z"],
            "signal": [Signal.KV_CACHE_USAGE_RATIO.value, Signal.PREEMPTIONS.value],
            "metric": ["vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"],
            "le": [None, None],
        },
        schema_overrides={"le": pl.Float64},
    )
    times = [T0 + timedelta(seconds=15 * i) for i in range(len(usage))]
    points = pl.LazyFrame(
        {
            "series_id": [1] * len(usage) + [2] * len(usage),
            "ts": times + times,
            "value": usage + preemptions_total,
        }
    )
    empty = pl.LazyFrame()
    return HealthInputs(
        start=T0,
        end=T0 + timedelta(seconds=15 * len(usage)),
        points=points,
        dimensions=dimensions,
        requests=empty,
        targets=empty,
        scrapes=empty,
    )


def test_full_kv_with_preemptions_is_pressure_and_ends_when_it_eases() -> None:
    quiet, busy = 20, 20  # scrapes: 5 quiet minutes, 5 under pressure, 5 quiet
    usage = [0.2] * quiet + [0.97] * busy + [0.2] * quiet
    counter = [0.0] * quiet + [float(i + 1) for i in range(busy)] + [float(busy)] * quiet
    (finding,) = KvPressureDetector().detect(_kv_inputs(usage, counter))
    assert finding.kind is FindingKind.KV_PRESSURE
    assert (finding.scope_unit, finding.scope) == (ScopeUnit.REPLICA, "vllm-0")
    assert finding.start == T0 + timedelta(minutes=5)
    assert finding.end == T0 + timedelta(minutes=10)
    evidence = {e.name: e.value for e in finding.evidence}
    assert evidence["preemptions"] == busy
    assert evidence["longest_episode_s"] == 300


def test_pressure_still_on_at_the_end_is_ongoing() -> None:
    usage = [0.2] * 20 + [0.97] * 20
    counter = [0.0] * 20 + [float(i + 1) for i in range(20)]
    (finding,) = KvPressureDetector().detect(_kv_inputs(usage, counter))
    assert finding.end is None


def test_full_kv_without_preemptions_is_not_pressure() -> None:
    # A full pool that admits nothing more is vLLM working as designed: no one is preempted.
    usage = [0.99] * 40
    assert KvPressureDetector().detect(_kv_inputs(usage, [0.0] * 40)) == []


def test_preemptions_at_low_usage_are_not_pool_pressure() -> None:
    usage = [0.3] * 40
    counter = [float(i) for i in range(40)]
    assert KvPressureDetector().detect(_kv_inputs(usage, counter)) == []


def test_overlapping_spans_chain_into_groups_and_an_ongoing_one_reaches_on() -> None:
    at = datetime(2026, 11, 19)

    def span(
        name: str, start_min: int, end_min: int | None
    ) -> tuple[str, datetime, datetime | None]:
        end = None if end_min is None else at + timedelta(minutes=end_min)
        return (name, at + timedelta(minutes=start_min), end)

    a, b, c, d, e = (
        span("a", 0, 10),
        span("b", 5, 20),  # overlaps a
        span("c", 15, 16),  # overlaps b, not a: chained into the same group
        span("d", 20, None),  # starts where b ends: a group of its own, ongoing
        span("e", 90, 95),  # within d's reach
    )
    groups = overlapping([e, c, a, d, b], start=lambda s: s[1], end=lambda s: s[2])
    assert groups == [[a, b, c], [d, e]]
