"""Failure table: seed 000's worked examples exactly, backlog and admission, zones, properties."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servewatch.capacity.failure_table import (
    ANOTHER_ZONE,
    FailureTableSpec,
    RateUnit,
    build_failure_table,
    failure_row,
)
from servewatch.capacity.placement import (
    NO_LAYOUT,
    FailureUnit,
    Host,
    Layout,
    _fill_levels,
    layout_from_inventory,
)


def spec(
    *,
    demand: float,
    per_replica: float,
    unit: FailureUnit,
    replicas_per_host: int = 1,
    zones: tuple[str, ...] = ("a",),
    backlog: float = 0.0,
    hosts: tuple[int, ...] = (),
    initial: Layout = NO_LAYOUT,
) -> FailureTableSpec:
    return FailureTableSpec(
        demand_rate=demand,
        replica_rate=per_replica,
        unit=RateUnit.REQ_PER_MIN,
        failure_unit=unit,
        zones=zones,
        replicas_per_host=replicas_per_host,
        gpus_per_replica=1,
        usd_per_gpu_hour=2.0,
        hours_per_month=730.0,
        recovery_interval_s=180.0,
        backlog_work=backlog,
        initial=initial,
        candidate_hosts=hosts,
    )


def test_seed_exercise_120_per_min_needs_three_hosts_of_two_replicas() -> None:
    table = build_failure_table(
        spec(demand=120, per_replica=40, unit=FailureUnit.HOST, replicas_per_host=2)
    )
    rows = {row.hosts: row for row in table.rows}
    assert sorted(rows) == [2, 3, 4]
    assert [rows[h].healthy_capacity for h in (2, 3, 4)] == [160, 240, 320]
    assert [rows[h].after_host_loss for h in (2, 3, 4)] == [80, 160, 240]
    assert [rows[h].meets_failure for h in (2, 3, 4)] == [False, True, True]
    assert table.minimum is not None
    assert (table.minimum.hosts, table.minimum.replicas) == (3, 6)
    # "It does not show that all 240 healthy requests could be admitted": only 160 can be.
    assert table.minimum.max_admission == 160
    # "Three hosts cost more than the two that meet healthy demand": the reserve is one host.
    assert table.healthy_minimum is not None
    assert table.healthy_minimum.hosts == 2
    assert table.minimum.reserve_usd_per_month == 2 * 2.0 * 730.0


@pytest.mark.parametrize(
    ("unit", "replicas_per_host", "hosts", "replicas", "after_loss"),
    [
        # "Four leave ninety and satisfy this simplified condition."
        (FailureUnit.REPLICA, 1, 4, 4, 90),
        # "Six replicas across three hosts, two per host, leave 120 after losing one host."
        (FailureUnit.HOST, 2, 3, 6, 120),
        (FailureUnit.NONE, 1, 3, 3, 90),
    ],
)
def test_seed_worked_example_90_per_min_at_30_per_replica(
    unit: FailureUnit, replicas_per_host: int, hosts: int, replicas: int, after_loss: float
) -> None:
    table = build_failure_table(
        spec(demand=90, per_replica=30, unit=unit, replicas_per_host=replicas_per_host)
    )
    assert table.minimum is not None
    assert (table.minimum.hosts, table.minimum.replicas) == (hosts, replicas)
    assert table.minimum.failed_capacity == after_loss


def test_seed_worked_example_counter_cases() -> None:
    # "Three replicas meet normal demand but leave only sixty after failure."
    three = build_failure_table(
        spec(demand=90, per_replica=30, unit=FailureUnit.REPLICA, hosts=(3,))
    ).rows[0]
    assert (three.healthy_capacity, three.after_replica_loss, three.meets_failure) == (
        90,
        60,
        False,
    )
    # "If replicas are placed two per host and a host failure is the requirement, four leave
    # only sixty."
    four = build_failure_table(
        spec(demand=90, per_replica=30, unit=FailureUnit.HOST, replicas_per_host=2, hosts=(2,))
    ).rows[0]
    assert (four.replicas, four.after_host_loss, four.meets_failure) == (4, 60, False)


def test_backlog_drains_at_failed_capacity_minus_arrivals() -> None:
    three_hosts = spec(
        demand=120, per_replica=40, unit=FailureUnit.HOST, replicas_per_host=2, hosts=(3,)
    )
    row = build_failure_table(replace(three_hosts, backlog_work=600)).rows[0]
    assert row.drain_rate == 40
    assert row.drain_s == pytest.approx(600 / 40 * 60)
    # Seed 000 checkpoint: failed capacity equal to arrivals never clears 600 queued requests.
    equal = build_failure_table(replace(three_hosts, demand_rate=160, backlog_work=600)).rows[0]
    assert equal.drain_rate == 0
    assert equal.drain_s is None
    assert not equal.meets_failure


def test_backlog_lowers_admission_and_raises_the_minimum() -> None:
    # Clearing 600 requests in 180 s takes 200 req/min beyond the 120 arriving: survivors need
    # 320, so 5 hosts of 80 (4 left after one is lost).
    table = build_failure_table(
        spec(demand=120, per_replica=40, unit=FailureUnit.HOST, replicas_per_host=2, backlog=600)
    )
    assert table.minimum is not None
    assert table.minimum.hosts == 5
    assert table.minimum.max_admission == pytest.approx(320 - 200)


def test_single_zone_with_zone_loss_cannot_be_fixed_by_adding_hosts_there() -> None:
    table = build_failure_table(
        spec(demand=120, per_replica=40, unit=FailureUnit.ZONE, replicas_per_host=2)
    )
    assert table.minimum is None
    assert all(row.after_zone_loss == 0 for row in table.rows)
    assert table.infeasible_reason is not None
    assert "adding hosts in zone 'a' cannot meet the requirement" in table.infeasible_reason
    # and it says what would: two zones of two hosts keep 160 after losing either zone
    assert f"'a' and {ANOTHER_ZONE}, 4 hosts (8 replicas) meet it" in table.infeasible_reason


def test_zone_loss_across_three_zones() -> None:
    table = build_failure_table(
        spec(
            demand=120,
            per_replica=40,
            unit=FailureUnit.ZONE,
            replicas_per_host=2,
            zones=("a", "b", "c"),
        )
    )
    assert table.minimum is not None
    # 3 hosts one per zone: losing a zone leaves 2 hosts = 160 >= 120.
    assert (table.minimum.hosts, table.minimum.zones, table.minimum.failed_capacity) == (3, 3, 160)


def test_growth_from_an_existing_single_zone_layout_into_a_new_zone() -> None:
    existing = layout_from_inventory(
        [("r1", "h1", "a"), ("r2", "h1", "a"), ("r3", "h2", "a"), ("r4", "h2", "a")]
    )
    table = build_failure_table(
        spec(
            demand=120,
            per_replica=40,
            unit=FailureUnit.ZONE,
            replicas_per_host=2,
            zones=("b",),
            initial=existing,
        )
    )
    # Zone a holds 4 replicas (160); zone b must hold 160 too, so 2 new hosts: 4 in all.
    assert table.minimum is not None
    assert (table.minimum.hosts, table.minimum.failed_capacity) == (4, 160)


def test_inventory_rejects_a_replica_on_two_hosts() -> None:
    with pytest.raises(ValueError, match="replica 'r1' is listed on 'h1'"):
        layout_from_inventory([("r1", "h1", "a"), ("r1", "h2", "a")])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("replica_rate", 0.0, "replica_rate is 0.0; allowed: a finite number, > 0"),
        ("demand_rate", float("nan"), "demand_rate is nan"),
        ("zones", (), "zones is empty"),
        ("candidate_hosts", (0,), "candidate of 0 hosts; allowed: 1 or more"),
    ],
)
def test_bad_spec_is_refused(field: str, value: Any, message: str) -> None:
    base = spec(demand=1, per_replica=1, unit=FailureUnit.HOST)
    with pytest.raises(ValueError, match=message):
        replace(base, **{field: value})


layouts = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(min_value=1, max_value=4)), max_size=5
).map(
    lambda hosts: Layout(
        tuple(Host(f"h{i}", zone, replicas) for i, (zone, replicas) in enumerate(hosts))
    )
)


@settings(max_examples=150, deadline=None)
@given(
    demand=st.floats(min_value=0, max_value=2000),
    per_replica=st.floats(min_value=1, max_value=200),
    unit=st.sampled_from(list(FailureUnit)),
    replicas_per_host=st.integers(min_value=1, max_value=4),
    zones=st.sampled_from([("a",), ("a", "b"), ("a", "b", "c"), ("c", "d")]),
    backlog=st.floats(min_value=0, max_value=5000),
    initial=layouts,
)
def test_table_is_monotone_in_hosts_and_admission_never_exceeds_failed_capacity(
    demand: float,
    per_replica: float,
    unit: FailureUnit,
    replicas_per_host: int,
    zones: tuple[str, ...],
    backlog: float,
    initial: Layout,
) -> None:
    base = spec(
        demand=demand,
        per_replica=per_replica,
        unit=unit,
        replicas_per_host=replicas_per_host,
        zones=zones,
        backlog=backlog,
        initial=initial,
    )
    # Fleets smaller than today's (hosts taken away) and larger (hosts added) alike.
    rows = [
        failure_row(
            base,
            initial.resized(hosts=n, zones=zones, replicas_per_host=replicas_per_host),
            healthy_replicas=0,
        )
        for n in range(1, len(initial.hosts) + 12)
    ]
    for row in rows:
        assert row.max_admission <= row.failed_capacity <= row.healthy_capacity
        assert row.failed_capacity >= 0
    for smaller, larger in pairwise(rows):
        assert larger.healthy_capacity >= smaller.healthy_capacity
        assert larger.failed_capacity >= smaller.failed_capacity
        assert larger.after_replica_loss >= smaller.after_replica_loss
        assert larger.after_host_loss >= smaller.after_host_loss
        assert larger.after_zone_loss >= smaller.after_zone_loss
    table = build_failure_table(base)
    if table.minimum is not None:
        assert table.minimum.meets_failure
        assert table.minimum.max_admission >= demand - 1e-9 * max(1.0, demand)
        if table.minimum.hosts > 1:
            below = failure_row(
                base,
                initial.resized(
                    hosts=table.minimum.hosts - 1, zones=zones, replicas_per_host=replicas_per_host
                ),
                healthy_replicas=0,
            )
            assert not below.meets_failure
    else:
        assert table.infeasible_reason


def _greedy(counts: list[int], extra: int) -> list[int]:
    current, added = list(counts), [0] * len(counts)
    for _ in range(extra):
        index = min(range(len(current)), key=lambda i: (current[i], i))
        current[index] += 1
        added[index] += 1
    return added


@given(
    counts=st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=5),
    extra=st.integers(min_value=0, max_value=40),
)
def test_level_filling_equals_adding_hosts_one_at_a_time(counts: list[int], extra: int) -> None:
    assert _fill_levels(counts, extra) == _greedy(counts, extra)


def test_a_fleet_larger_than_needed_is_told_to_shrink_and_its_reserve_counted() -> None:
    # Today: 4 hosts of 4 replicas in two zones, 136 req/min a replica, demand 578 req/min.
    today = Layout(tuple(Host(f"host-{i}", "zone-a" if i < 2 else "zone-b", 4) for i in range(4)))
    table = build_failure_table(
        spec(
            demand=578,
            per_replica=136,
            unit=FailureUnit.HOST,
            replicas_per_host=4,
            zones=("zone-a", "zone-b"),
            initial=today,
        )
    )
    assert table.minimum is not None
    assert table.healthy_minimum is not None
    # 2 hosts (8 replicas, 1,088) meet healthy demand; losing one of them leaves 544 < 578, so
    # 3 hosts are the answer, one fewer than today, and the third host is the reserve.
    assert (table.healthy_minimum.hosts, table.minimum.hosts) == (2, 3)
    assert [row.hosts for row in table.rows] == [2, 3, 4]
    assert table.minimum.reserve_usd_per_month == 4 * 2.0 * 730.0


def test_hosts_are_taken_from_the_fullest_zone_smallest_host_first() -> None:
    layout = Layout(
        (Host("a1", "a", 2), Host("a2", "a", 1), Host("a3", "a", 2), Host("b1", "b", 2))
    )
    assert [h.name for h in layout.shrunk(hosts=3).hosts] == ["a1", "a3", "b1"]
    assert [h.name for h in layout.shrunk(hosts=2).hosts] == ["a1", "b1"]
    assert [h.name for h in layout.shrunk(hosts=1).hosts] == ["a1"]
