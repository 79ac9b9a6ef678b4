"""Autoscaler lag: a traffic step whose harm lasted until new replicas of the pool served. The
autoscaler did add capacity, but a step is over (or the error budget spent) in the time it
takes to notice the step, start replicas and cold-start them; the fix is a leading signal and
warm spares, not more replicas at the end.

A replica is new to a step when it had not served in the window before the step started (no
successful scrape, no finished request: its target was not there yet, or was there and had
not answered) and first serves after the step started, by the step's end. The lag runs from
the step's start to the first new replica serving; a new replica's cold start from its
target's first sighting (the window's start when it was seen before) to its first successful
scrape or first finished request, whichever is earlier.

The `TrafficStepDetector` finds the step and its harm and asks `autoscaler_lag` whether the
step was one: when new replicas served during it and the harm was clear until they did, the
step is reported as this one finding instead of a traffic step.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.step_harm import SpanHarm

_MINUTE = timedelta(minutes=1)


def replica_service(inputs: HealthInputs, pools: pl.LazyFrame) -> pl.DataFrame:
    """One row per engine replica: replica, pool, first_seen_ts (its targets' first sighting,
    not before the window), first_serving_ts (its first successful scrape or finished request
    in the window; null when it never served)."""
    targets = inputs.targets.filter(pl.col("replica").is_not_null())
    seen = targets.group_by("replica").agg(first_seen_ts=pl.col("first_seen_ts").min())
    scraped = (
        inputs.scrapes.filter(pl.col("ok"))
        .join(targets.select("target_id", "replica"), on="target_id", how="inner")
        .group_by("replica")
        .agg(first_scrape_ts=pl.col("ts").min())
    )
    finished = (
        inputs.requests.filter(pl.col("replica").is_not_null() & pl.col("ok"))
        .group_by("replica")
        .agg(first_finished_ts=pl.col("end_ts").min())
    )
    window_start = pl.lit(inputs.start, dtype=pl.Datetime("us"))
    return (
        pools.select("replica", "pool")
        .join(seen, on="replica", how="left")
        .join(scraped, on="replica", how="left")
        .join(finished, on="replica", how="left")
        .select(
            "replica",
            "pool",
            first_seen_ts=pl.max_horizontal(
                pl.col("first_seen_ts").fill_null(window_start), window_start
            ),
            first_serving_ts=pl.min_horizontal("first_scrape_ts", "first_finished_ts"),
        )
        .sort("replica")
        .collect()
    )


@dataclass(frozen=True)
class NewReplicas:
    """The replicas a pool gained during a step: names, first sightings and first serving."""

    replicas: tuple[str, ...]
    first_seen: tuple[datetime, ...]
    first_serving: tuple[datetime, ...]
    serving_before: int

    @property
    def serving_from(self) -> datetime:
        return min(self.first_serving)

    @property
    def all_serving_from(self) -> datetime:
        return max(self.first_serving)

    @property
    def cold_starts_s(self) -> list[float]:
        return [
            (served - seen).total_seconds()
            for seen, served in zip(self.first_seen, self.first_serving, strict=True)
        ]


def new_replicas(
    service: pl.DataFrame, pool: str, *, start: datetime, until: datetime
) -> NewReplicas | None:
    """The pool's replicas that first served in (start, until]; None when there are none or
    the pool served with no replica before (a pool that is new is not a step's lag)."""
    mine = service.filter(pl.col("pool") == pool)
    before = mine.filter(pl.col("first_serving_ts") <= start)
    added = mine.filter(
        (pl.col("first_serving_ts") > start) & (pl.col("first_serving_ts") <= until)
    ).sort("first_serving_ts")
    if added.is_empty() or before.is_empty():
        return None
    return NewReplicas(
        replicas=tuple(added["replica"]),
        first_seen=tuple(added["first_seen_ts"]),
        first_serving=tuple(added["first_serving_ts"]),
        serving_before=before.height,
    )


def lag_span(start: datetime, added: NewReplicas) -> tuple[datetime, datetime] | None:
    """The step's minutes before the first new replica served: where the harm must be clear
    for the step to be the autoscaler's lag (None when they served within its first minute)."""
    serving_minute = added.serving_from.replace(second=0, microsecond=0)
    return (start, serving_minute) if serving_minute > start else None


def lag_finding(
    *,
    pool: str,
    start: datetime,
    end: datetime | None,
    added: NewReplicas,
    lag_harm: SpanHarm,
    after_harm: SpanHarm | None,
    after_clarity: float,
    confidence: float,
    step_evidence: tuple[Evidence, ...],
) -> Finding:
    """The autoscaler_lag finding. It ends the minute after the last new replica served when
    the harm did not outlast them (`after_clarity` 0), else with the step (`end`)."""
    lag_s = (added.serving_from - start).total_seconds()
    cold_starts_s = sorted(added.cold_starts_s)
    cold_start_s = cold_starts_s[len(cold_starts_s) // 2]
    caught_up = added.all_serving_from.replace(second=0, microsecond=0) + _MINUTE
    # Capacity caught up once the last new replica served; the harm is the lag's only if it
    # did not outlast them (else the step was bigger than what the autoscaler added).
    finding_end = max(caught_up, start) if after_clarity == 0.0 else end
    evidence = [
        Evidence("lag_s", lag_s, "s"),
        Evidence("cold_start_s", cold_start_s, "s"),
        Evidence("replicas_added", float(len(added.replicas)), "count"),
        Evidence(
            "serving_replicas",
            float(added.serving_before + len(added.replicas)),
            "count",
            baseline=float(added.serving_before),
        ),
        Evidence(
            "bad_requests_before_serving",
            lag_harm.bad_requests,
            "count",
            baseline=lag_harm.expected_bad_requests,
        ),
    ]
    attained = lag_harm.attainment_ratio
    if attained is not None:
        evidence.append(
            Evidence(
                "attainment_before_serving_ratio",
                attained,
                "ratio",
                baseline=lag_harm.baseline_attainment_ratio,
            )
        )
    if after_harm is not None and after_harm.attainment_ratio is not None:
        evidence.append(
            Evidence(
                "attainment_after_serving_ratio",
                after_harm.attainment_ratio,
                "ratio",
                baseline=after_harm.baseline_attainment_ratio,
            )
        )
    names = ", ".join(added.replicas)
    return Finding(
        kind=FindingKind.AUTOSCALER_LAG,
        scope_unit=ScopeUnit.POOL,
        scope=pool,
        start=start,
        end=finding_end,
        confidence=round(confidence, 4),
        summary=(
            f"pool {pool or '(none)'}: capacity followed a traffic step at {start:%H:%M} "
            f"{lag_s / 60:.1f} min late: {len(added.replicas)} new replica(s) ({names}) served "
            f"from {added.serving_from:%H:%M} after a {cold_start_s:.0f} s cold start; "
            f"{lag_harm.bad_requests:.0f} bad requests meanwhile against "
            f"{lag_harm.expected_bad_requests:.0f} expected"
        ),
        evidence=(*evidence, *step_evidence),
        suggestion=(
            "scale on a leading signal (arrivals, queue depth, KV use) rather than on latency, "
            "keep warm spare replicas or cut the cold start (cached weights, smaller images) so "
            "new replicas serve within the step's first minutes"
        ),
    )
