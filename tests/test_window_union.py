"""`union_windows`: the shards' windows read as one store's."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
import pytest

from servewatch.pipeline.tables import (
    POINTS_SCHEMA,
    SERIES_SCHEMA,
    SLO_MINUTES_SCHEMA,
    TARGETS_SCHEMA,
)
from servewatch.pipeline.window import WINDOW_TABLES, TimeSpan, Window
from servewatch.pipeline.window_union import union_windows

T = datetime(2026, 11, 18, 10, 0, 0)


def window(**frames: pl.DataFrame) -> Window:
    empty = {table: pl.DataFrame(schema=schema) for table, schema in WINDOW_TABLES.items()}
    return Window(
        from_ts=T,
        to_ts=T + timedelta(hours=1),
        points_from_ts=T - timedelta(minutes=1),
        points_to_ts=T + timedelta(hours=1),
        stored_points=TimeSpan(T, T + timedelta(minutes=5)),
        stored_requests=None,
        **(empty | frames),  # type: ignore[arg-type]
    )


def series(*rows: tuple[int, str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        [(i, target, "kv", metric, "{}", "scrape") for i, target, metric in rows],
        schema=SERIES_SCHEMA,
        orient="row",
    )


def points(*rows: tuple[int, int, float]) -> pl.DataFrame:
    return pl.DataFrame(
        [(i, T + timedelta(seconds=s), v) for i, s, v in rows], schema=POINTS_SCHEMA, orient="row"
    )


def target(target_id: str, first: int, last: int) -> pl.DataFrame:
    row = (target_id, "vllm", None, target_id, None, None, None, None, 1)
    seen = (T + timedelta(minutes=first), T + timedelta(minutes=last), [])
    return pl.DataFrame([(*row, *seen)], schema=TARGETS_SCHEMA, orient="row")


def test_series_ids_are_keyed_by_target_metric_and_labels_not_by_store() -> None:
    # Both stores call their first series 0; "b" moved from the first shard to the second.
    first = window(
        series=series((0, "a", "m"), (1, "b", "m")), points=points((0, 0, 1.0), (1, 0, 2.0))
    )
    second = window(
        series=series((0, "b", "m"), (1, "c", "m")), points=points((0, 15, 3.0), (1, 15, 4.0))
    )
    joined = union_windows([first, second])
    by_key = dict(zip(joined.series["target_id"], joined.series["series_id"], strict=True))
    assert sorted(by_key) == ["a", "b", "c"]
    values = joined.points.join(joined.series, on="series_id").select("target_id", "value")
    assert sorted(values.rows()) == [("a", 1.0), ("b", 2.0), ("b", 3.0), ("c", 4.0)]
    assert joined.points.schema == POINTS_SCHEMA
    assert joined.series.schema == SERIES_SCHEMA


def test_a_target_in_two_stores_is_one_row_seen_over_both() -> None:
    joined = union_windows([window(targets=target("b", 0, 5)), window(targets=target("b", 5, 9))])
    assert joined.targets.height == 1
    assert joined.targets.row(0, named=True)["first_seen_ts"] == T
    assert joined.targets.row(0, named=True)["last_seen_ts"] == T + timedelta(minutes=9)


def test_slo_minutes_add_up_and_null_token_counts_stay_null() -> None:
    def minute(good: int, total: int, tokens: int | None) -> pl.DataFrame:
        row = (T, "ttft", "r0", good, total, "chat", "m", None, tokens, tokens, None)
        return pl.DataFrame([row], schema=SLO_MINUTES_SCHEMA, orient="row")

    joined = union_windows(
        [window(slo_minutes=minute(3, 4, 10)), window(slo_minutes=minute(1, 2, 5))]
    )
    assert joined.slo_minutes.select("good", "total", "output_tokens").row(0) == (4, 6, 15)
    metric_rows = union_windows(
        [window(slo_minutes=minute(3, 4, None)), window(slo_minutes=minute(1, 2, None))]
    )
    assert metric_rows.slo_minutes["output_tokens"].to_list() == [None]


def test_windows_of_different_ranges_are_refused() -> None:
    later = window()
    later = Window(**{**later.__dict__, "to_ts": T + timedelta(hours=2)})
    with pytest.raises(ValueError, match="windows of different ranges cannot be joined"):
        union_windows([window(), later])
    with pytest.raises(ValueError, match="at least one window"):
        union_windows([])
