"""Several stores' windows read as one: the shards of one fleet, each collector with its store.

Sharded collectors split the targets, so each store holds its own targets' series and scrapes;
spans are not sharded (a replica exports to whichever collector it is given), so a replica's
requests may lie in several stores, and a span resent to two of them lies in both. The union is
what one store holding everything would have answered:

- series are keyed by (target, metric, labels), not by the stores' own integer ids, which
  collide; each gets a new id, in key order, and its points follow it. A target that moved
  between shards (the shard count changed) keeps one series, its points from both stores.
- requests are stored once per (trace, span); the minute rollup is counted again from the
  union's requests, since per-minute percentiles of parts do not combine.
- `slo_minutes` are counts: a minute's good and total events add up over the stores.
- targets and scrapes are keyed by target (and time); the stored spans widen to cover all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import polars as pl

from servewatch.pipeline.request_minutes import request_minutes
from servewatch.pipeline.tables import (
    POINTS_SCHEMA,
    SERIES_SCHEMA,
    SLO_MINUTES_SCHEMA,
    TARGETS_SCHEMA,
)
from servewatch.pipeline.window import TimeSpan, Window

SERIES_KEY = ("target_id", "metric", "labels")
SLO_MINUTE_KEY = ("minute_ts", "slo", "replica", "pool", "model", "tenant", "adapter")
SLO_MINUTE_COUNTS = ("good", "total", "good_output_tokens", "output_tokens")


def union_windows(windows: Sequence[Window]) -> Window:
    """One window of what `windows` (the same query, read from several stores) hold together.
    A single window is returned as it is."""
    if not windows:
        raise ValueError("a union of windows needs at least one window")
    first = windows[0]
    if len(windows) == 1:
        return first
    bounds = {(w.from_ts, w.to_ts, w.points_from_ts, w.points_to_ts) for w in windows}
    if len(bounds) > 1:
        raise ValueError(
            f"windows of different ranges cannot be joined: {sorted(map(str, bounds))}"
        )
    series, points = _series_and_points(windows)
    requests = (
        pl.concat([w.requests for w in windows])
        .unique(["trace_id", "span_id"], keep="first", maintain_order=True)
        .sort("end_ts", "trace_id", "span_id")
    )
    return replace(
        first,
        requests=requests,
        request_minutes=request_minutes(requests.lazy()).collect(),
        request_minutes_current=False,
        slo_minutes=_slo_minutes(windows),
        points=points,
        series=series,
        targets=_targets(windows),
        scrapes=pl.concat([w.scrapes for w in windows])
        .unique(["target_id", "ts"], keep="first", maintain_order=True)
        .sort("target_id", "ts"),
        stored_points=_span([w.stored_points for w in windows]),
        stored_requests=_span([w.stored_requests for w in windows]),
    )


def _series_and_points(windows: Sequence[Window]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Series under new ids (one per key, in key order) and every store's points under them;
    a point two stores hold at the same instant is kept once."""
    tagged = pl.concat(
        [w.series.with_columns(store=pl.lit(i, pl.Int32)) for i, w in enumerate(windows)]
    )
    keys = (
        tagged.unique(SERIES_KEY, keep="first", maintain_order=True)
        .sort(SERIES_KEY)
        .with_row_index("new_id")
        .with_columns(pl.col("new_id").cast(pl.Int32))
    )
    ids = tagged.join(keys.select(*SERIES_KEY, "new_id"), on=list(SERIES_KEY)).select(
        "store", "series_id", "new_id"
    )
    series = (
        keys.drop("series_id", "store")
        .rename({"new_id": "series_id"})
        .select(SERIES_SCHEMA.names())
    )
    points = (
        pl.concat([w.points.with_columns(store=pl.lit(i, pl.Int32)) for i, w in enumerate(windows)])
        .join(ids, on=["store", "series_id"])
        .select(pl.col("new_id").alias("series_id"), "ts", "value")
        .unique(["series_id", "ts"], keep="first", maintain_order=True)
        .sort("series_id", "ts")
    )
    return series.cast(SERIES_SCHEMA), points.cast(POINTS_SCHEMA)


def _targets(windows: Sequence[Window]) -> pl.DataFrame:
    """One row per target: the last-seen store's row, first and last seen over all stores."""
    targets = pl.concat([w.targets for w in windows])
    return (
        targets.sort("target_id", "last_seen_ts", nulls_last=False)
        .group_by("target_id", maintain_order=True)
        .agg(
            pl.all().exclude("first_seen_ts", "last_seen_ts").last(),
            pl.col("first_seen_ts").min(),
            pl.col("last_seen_ts").max(),
        )
        .select(TARGETS_SCHEMA.names())
        .sort("target_id")
        .cast(TARGETS_SCHEMA)
    )


def _slo_minutes(windows: Sequence[Window]) -> pl.DataFrame:
    frames = pl.concat([w.slo_minutes for w in windows])
    return (
        frames.group_by(SLO_MINUTE_KEY)
        .agg(
            # Token counts are null on metric-counted rows: a sum of nulls stays null.
            pl.when(pl.col(c).is_null().all()).then(None).otherwise(pl.col(c).sum()).alias(c)
            for c in SLO_MINUTE_COUNTS
        )
        .select(SLO_MINUTES_SCHEMA.names())
        .sort("slo", "minute_ts", "replica", nulls_last=True)
        .cast(SLO_MINUTES_SCHEMA)
    )


def _span(spans: Sequence[TimeSpan | None]) -> TimeSpan | None:
    present = [s for s in spans if s is not None]
    if not present:
        return None
    return TimeSpan(min(s.first for s in present), max(s.last for s in present))
