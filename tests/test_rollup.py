"""Minute rollups: incremental runs equal a full recompute, and any window's sum equals the
window computed from the raw rows (property tests against a brute-force oracle)."""

from __future__ import annotations

import hashlib
import itertools
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from servewatch.pipeline.request_minutes import EventCriterion, request_minutes, slo_minutes
from servewatch.pipeline.tables import REQUESTS_SCHEMA
from servewatch.store import Store
from servewatch.store.rollup_job import roll_up_requests

T0 = datetime(2026, 11, 18, 10, 0, 0)
CRITERIA = (
    EventCriterion("ttft-500ms", ttft_limit_s=0.5),
    EventCriterion("chat-goodput", ttft_limit_s=0.5, tpot_limit_s=0.05),
    EventCriterion("availability"),
)

request_st = st.fixed_dictionaries(
    {
        "end_s": st.integers(min_value=0, max_value=30 * 60 - 1),
        "replica": st.sampled_from(["r0", "r1", None]),
        "ok": st.booleans(),
        "ttft_s": st.sampled_from([0.1, 0.5, 0.7]),
        "decode_s": st.sampled_from([0.0, 0.4, 2.0]),
        "completion_tokens": st.sampled_from([1, 9, 41]),
        # A span may lack the output token count: it adds no tokens, good or not.
        "tokens_known": st.booleans(),
    }
)


def frame(rows: list[dict[str, Any]], start_index: int) -> pl.DataFrame:
    full = []
    for i, row in enumerate(rows, start=start_index):
        end = T0 + timedelta(seconds=row["end_s"], microseconds=i)
        full.append(
            {name: None for name in REQUESTS_SCHEMA.names()}
            | {
                "trace_id": f"{i:032x}",
                "span_id": f"{i:016x}",
                "replica": row["replica"],
                "arrival_ts": end - timedelta(seconds=3),
                "end_ts": end,
                "ok": row["ok"],
                "prompt_tokens": 100,
                "completion_tokens": row["completion_tokens"]
                if row.get("tokens_known", True)
                else None,
                "ttft_s": row["ttft_s"],
                "decode_s": row["decode_s"],
                "e2e_s": row["ttft_s"] + row["decode_s"],
                "emulated": True,
            }
        )
    return pl.DataFrame(full, schema=REQUESTS_SCHEMA)


def is_good(row: dict[str, Any], criterion: EventCriterion) -> bool:
    # Without a token count TPOT is unknown, which meets any TPOT limit.
    n = row["completion_tokens"] if row.get("tokens_known", True) else 0
    tpot = row["decode_s"] / (n - 1) if n > 1 else 0
    return row["ok"] and all(
        (
            criterion.ttft_limit_s is None or row["ttft_s"] <= criterion.ttft_limit_s,
            criterion.tpot_limit_s is None or tpot <= criterion.tpot_limit_s,
        )
    )


def brute_force_good(rows: list[dict[str, Any]], criterion: EventCriterion) -> int:
    return sum(is_good(row, criterion) for row in rows)


def tokens(row: dict[str, Any]) -> int:
    return row["completion_tokens"] if row.get("tokens_known", True) else 0


def brute_force_good_tokens(rows: list[dict[str, Any]], criterion: EventCriterion) -> int:
    return sum(tokens(row) for row in rows if is_good(row, criterion))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(request_st, min_size=0, max_size=25), min_size=1, max_size=4),
    window=st.tuples(st.integers(0, 29), st.integers(1, 30)),
)
def test_incremental_rollups_sum_to_any_window(
    batches: list[list[dict[str, Any]]], window: tuple[int, int]
) -> None:
    ticks = itertools.count()
    clock = lambda: T0 + timedelta(hours=1, seconds=next(ticks))  # noqa: E731
    everything: list[dict[str, Any]] = []
    with Store.open(":memory:", clock=clock) as store:
        for batch in batches:  # later batches may hold earlier minutes: late data
            store.write_requests(frame(batch, len(everything)))
            everything.extend(batch)
            roll_up_requests(store, criteria=CRITERIA)
        incremental = store.read_slo_minutes().collect()
        per_replica = store.read_request_minutes().collect()

    raw = frame(everything, 0).lazy()
    full = slo_minutes(raw, criteria=CRITERIA).collect()
    assert incremental.sort(pl.all()).equals(full.sort(pl.all()))
    full_minutes = request_minutes(raw).collect()
    assert per_replica["requests"].sum() == len(everything)
    # The store aggregates inside DuckDB; the Polars definition is the oracle.
    key = ["minute_ts", "replica"]
    assert_frame_equal(
        per_replica.sort(key, nulls_last=True),
        full_minutes.sort(key, nulls_last=True),
        check_exact=False,
        rel_tol=1e-9,
    )

    lo_min, length = window
    lo, hi = T0 + timedelta(minutes=lo_min), T0 + timedelta(minutes=lo_min + length)
    in_window = [r for r in everything if lo <= T0 + timedelta(seconds=r["end_s"]) < hi]
    for criterion in CRITERIA:
        summed = incremental.filter(
            (pl.col("slo") == criterion.name)
            & pl.col("minute_ts").is_between(lo, hi, closed="left")
        )
        assert summed["total"].sum() == len(in_window)
        assert summed["good"].sum() == brute_force_good(in_window, criterion)
        assert summed["output_tokens"].sum() == sum(tokens(row) for row in in_window)
        assert summed["good_output_tokens"].sum() == brute_force_good_tokens(in_window, criterion)


def test_nothing_new_does_no_work_and_criteria_change_recomputes() -> None:
    ticks = itertools.count()
    with Store.open(":memory:", clock=lambda: T0 + timedelta(seconds=next(ticks))) as store:
        rows = [
            {
                "end_s": s,
                "replica": "r0",
                "ok": True,
                "ttft_s": 0.1,
                "decode_s": 0.4,
                "completion_tokens": 9,
            }
            for s in (5, 65, 125)
        ]
        store.write_requests(frame(rows, 0))
        first = roll_up_requests(store, criteria=CRITERIA)
        assert (first.minutes, first.requests, first.full) == (3, 3, True)
        again = roll_up_requests(store, criteria=CRITERIA[:1])
        assert again.full
        assert set(store.read_slo_minutes().collect()["slo"]) == {"ttft-500ms"}
        quiet = roll_up_requests(store, criteria=CRITERIA[:1])
        assert not quiet.full
        assert quiet.minutes <= 3  # at most the last batch's minutes, never history
        late = [
            {
                "end_s": 70,
                "replica": "r1",
                "ok": False,
                "ttft_s": 0.1,
                "decode_s": 0.4,
                "completion_tokens": 9,
            }
        ]
        store.write_requests(frame(late, 10))
        report = roll_up_requests(store, criteria=CRITERIA[:1])
        assert report.minutes == 1  # only the late request's minute is recomputed
        minute = (
            store.read_slo_minutes()
            .collect()
            .filter(pl.col("minute_ts") == T0 + timedelta(minutes=1))
        )
        assert minute["total"].sum() == 2
        assert minute["good"].sum() == 1


def test_minutes_rolled_up_before_token_counts_are_recomputed_once(tmp_path: Path) -> None:
    db = tmp_path / "before-11.duckdb"
    rows = [
        {"end_s": s, "replica": "r0", "ok": True, "ttft_s": 0.1, "decode_s": 0.4}
        | {"completion_tokens": 9}
        for s in (5, 65)
    ]
    with Store.open(db, clock=lambda: T0 + timedelta(hours=1)) as store:
        store.write_requests(frame(rows, 0))
        roll_up_requests(store, criteria=CRITERIA)
        # As the store was before migration 11 (and so before 12 to 14): no token or adapter
        # columns, fingerprinted without a computation version.
        store._con.execute("ALTER TABLE slo_minutes DROP COLUMN adapter")
        store._con.execute("ALTER TABLE requests DROP COLUMN adapter")
        store._con.execute("ALTER TABLE slo_minutes DROP COLUMN good_output_tokens")
        store._con.execute("ALTER TABLE slo_minutes DROP COLUMN output_tokens")
        store._con.execute("ALTER TABLE targets DROP COLUMN gpu_uuids")
        store._con.execute("DROP TABLE recorded_points")
        store._con.execute("DROP TABLE rollup_partitions")
        store._con.execute("DELETE FROM schema_version WHERE version >= 11")
        text = "|".join(sorted(repr(c) for c in CRITERIA))
        old = hashlib.sha256(text.encode()).hexdigest()[:16]
        store._con.execute(
            "UPDATE rollup_watermarks SET fingerprint = ? WHERE source = 'slo_minutes'", [old]
        )
    with Store.open(db, clock=lambda: T0 + timedelta(hours=2)) as store:
        assert store.read_slo_minutes().collect()["output_tokens"].null_count() > 0
        report = roll_up_requests(store, criteria=CRITERIA)
        assert report.full
        minutes = store.read_slo_minutes().collect()
        assert minutes["output_tokens"].to_list() == [9] * len(minutes)
        assert roll_up_requests(store, criteria=CRITERIA).minutes == 0
