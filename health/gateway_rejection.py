"""The gateway-rejection detector: the gateway in front of a pool refuses a share of the
requests that reach it (429s shed by admission or flow control, a saturated pool, no endpoint
to pick) well above its own recent share, for minutes on end. No replica sees those requests,
so nothing on the engines' pages counts them: only the gateway's own counters do.

Per pool and minute it reads the endpoint picker's counters (`collectors/metrics/
gateway_catalogue.py`): requests it handed to a replica (`gateway_requests`) and errors by
`error_code` (`gateway_request_errors`). A rejection is an error whose code means a capacity
refusal (`pipeline.signals.GATEWAY_REJECTION_CODES`), never a bad request. The picker counts a
refused request among its errors only, so the requests that reached the gateway are those it
routed plus those it refused, and the rejected share is refused / reached. An error series is
born at its first error: its first sample counts from zero when the gateway was scraped before
it (Prometheus' `increase` would drop it, and with it the onset).

A minute is judged against its own baseline: refused / reached over the `baseline_minutes`
before, left out the minutes that were elevated themselves (at least
`min_rejected_per_minute` refusals and a share `min_share_increase` or more), unknown (taken
as 0) below `min_baseline_requests`. It is a rejection minute when the gateway refused at
least `min_rejected_per_minute` requests, its share is at least `min_share_increase` above the
baseline, and that many refusals are unlikely at the baseline share: P(X >= refused) <=
`significance` for X ~ Binomial(reached, baseline). Rejection minutes bridged over gaps of up
to `max_gap_minutes` form an episode of at least `min_minutes`.

Each finding says what the engines were doing meanwhile, from the pool's replicas' gauges:
full (requests waiting, `full_waiting_per_replica` or more per replica, or KV-cache usage at
`full_kv_ratio`) means the pool is at capacity and the gateway shed what it could not serve;
idle means the replicas had room and the gateway's limit is set below the pool's capacity (a
quota or limit misconfiguration). When the gateway's counters tell models (or tenants'
objectives) apart by `model_name` and only some were refused, the finding names them.

Confidence: 1 - m x P(X >= K), X ~ Binomial(N, p), for the K refusals among the N requests
that reached the gateway in the episode and p their mean baseline share, with m the
pool-minutes judged in the window (a Bonferroni bound), clipped to [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import polars as pl

from servewatch.health.episodes import (
    MINUTE,
    binomial_tail,
    binomial_tail_of,
    episode_end,
    flagged_episodes,
)
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.pipeline.replica_minutes import gauge_minutes, replica_pools
from servewatch.pipeline.signals import GATEWAY_REJECTION_CODES, Signal

_MINUTE_SCHEMA = {
    "pool": pl.String(),
    "model_name": pl.String(),
    "minute_ts": pl.Datetime("us"),
    "routed": pl.Float64(),
    "rejected": pl.Float64(),
}


@dataclass(frozen=True)
class _Load:
    """What a pool's replicas held while its gateway refused requests: per replica, running
    and waiting requests (and before the episode), mean KV-cache usage, and whether full."""

    running: float | None
    waiting: float | None
    kv: float | None
    running_before: float | None
    waiting_before: float | None
    full: bool


@dataclass(frozen=True)
class GatewayRejectionDetector:
    """Thresholds (defaults in brackets):
    - `significance` [0.01]: the binomial tail at the baseline share a rejection minute needs;
    - `min_rejected_per_minute` [3]: refusals a rejection minute needs;
    - `min_share_increase` [0.02]: how far above the baseline (2 percentage points) the
      minute's rejected share must be to matter, however certain;
    - `min_minutes` [2], `max_gap_minutes` [2]: an episode's rejection minutes and bridged
      gaps;
    - `baseline_minutes` [30], `min_baseline_requests` [50]: the baseline's span and the
      requests it needs to be known;
    - `full_waiting_per_replica` [1.0], `full_kv_ratio` [0.9]: the mean waiting requests per
      replica, or KV-cache usage, at which the pool's replicas count as full.
    """

    significance: float = 0.01
    min_rejected_per_minute: int = 3
    min_share_increase: float = 0.02
    min_minutes: int = 2
    max_gap_minutes: int = 2
    baseline_minutes: int = 30
    min_baseline_requests: int = 50
    full_waiting_per_replica: float = 1.0
    full_kv_ratio: float = 0.9
    kind = FindingKind.GATEWAY_REJECTION  # a class attribute, not a field: it never varies

    def model_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool, model_name and minute: routed and rejected requests (floats), from the
        gateway's counters; pool "" when the gateway's target names none."""
        label = pl.col("labels").str.json_path_match
        chosen = inputs.dimensions.filter(
            pl.col("signal").is_in(
                [Signal.GATEWAY_REQUESTS.value, Signal.GATEWAY_REQUEST_ERRORS.value]
            )
        ).select(
            "series_id",
            "target_id",
            "signal",
            pl.col("pool").fill_null(""),
            model_name=label("$.model_name").fill_null(""),
            error_code=label("$.error_code"),
        )
        points = inputs.points.join(chosen, on="series_id", how="inner")
        value = pl.col("value")
        previous = value.shift(1).over("series_id", order_by="ts")
        # A series born after its target's first scrape started from zero (see docstring).
        born_late = pl.col("ts").min().over("series_id") > pl.col("ts").min().over("target_id")
        delta = (
            pl.when(previous.is_null())
            .then(pl.when(born_late).then(value))
            .when(value < previous)
            .then(value)
            .otherwise(value - previous)
        )
        refusal = (pl.col("signal") == Signal.GATEWAY_REQUEST_ERRORS.value) & pl.col(
            "error_code"
        ).is_in(list(GATEWAY_REJECTION_CODES))
        routed = pl.col("signal") == Signal.GATEWAY_REQUESTS.value
        return (
            points.with_columns(delta=delta, minute_ts=pl.col("ts").dt.truncate("1m"))
            .filter(
                pl.col("delta").is_not_null()
                & (pl.col("minute_ts") >= inputs.start)
                & (pl.col("minute_ts") < inputs.end)
            )
            .group_by("pool", "model_name", "minute_ts")
            .agg(
                routed=pl.col("delta").filter(routed).sum().cast(pl.Float64),
                rejected=pl.col("delta").filter(refusal).sum().cast(pl.Float64),
            )
            .match_to_schema(_MINUTE_SCHEMA)
        )

    def pool_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool-minute: routed, rejected, reached, rejected_ratio, baseline_reached,
        baseline_rejected, baseline_ratio (null when unknown), tail and flagged."""
        minutes = (
            self.model_minutes(inputs)
            .group_by("pool", "minute_ts")
            .agg(pl.col("routed").sum(), pl.col("rejected").sum())
            .with_columns(reached=pl.col("routed") + pl.col("rejected"))
            .with_columns(
                rejected_ratio=pl.when(pl.col("reached") > 0).then(
                    pl.col("rejected") / pl.col("reached")
                )
            )
            .sort("pool", "minute_ts")
        )
        # Judged against an absolute bar, so that the baseline does not depend on itself.
        elevated = (pl.col("rejected") >= self.min_rejected_per_minute) & (
            pl.col("rejected_ratio") >= self.min_share_increase
        )
        normal = ~elevated.fill_null(value=False)
        window = f"{self.baseline_minutes}m"

        def before(column: str) -> pl.Expr:
            return (
                pl.when(normal)
                .then(pl.col(column))
                .otherwise(0.0)
                .rolling_sum_by("minute_ts", window_size=window, closed="left")
                .over("pool")
            )

        return (
            minutes.with_columns(
                baseline_reached=before("reached"), baseline_rejected=before("rejected")
            )
            .with_columns(
                baseline_ratio=pl.when(
                    pl.col("baseline_reached") >= self.min_baseline_requests
                ).then(pl.col("baseline_rejected") / pl.col("baseline_reached"))
            )
            .with_columns(_reference=pl.col("baseline_ratio").fill_null(0.0))
            .with_columns(tail=binomial_tail_of("rejected", "reached", "_reference"))
            .with_columns(
                flagged=(
                    (pl.col("rejected") >= self.min_rejected_per_minute)
                    & (pl.col("rejected_ratio") >= pl.col("_reference") + self.min_share_increase)
                    & (pl.col("tail") <= self.significance)
                ).fill_null(value=False)
            )
            .drop("_reference")
            .sort("pool", "minute_ts")
        )

    def engine_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool-minute, over the pool's replicas: replicas (reporting), running and
        waiting (summed over them), kv_usage_ratio (their mean)."""
        points, dims = inputs.points, inputs.dimensions
        pools = replica_pools(dims).select("replica", "pool")
        on = ["replica", "minute_ts"]

        def gauge(signal: Signal, name: str) -> pl.LazyFrame:
            return gauge_minutes(
                points, dims, signal=signal, name=name, start=inputs.start, end=inputs.end
            ).select(*on, pl.col(f"{name}_mean").alias(name))

        return (
            gauge(Signal.REQUESTS_RUNNING, "running")
            .join(gauge(Signal.REQUESTS_WAITING, "waiting"), on=on, how="full", coalesce=True)
            .join(gauge(Signal.KV_CACHE_USAGE_RATIO, "kv"), on=on, how="full", coalesce=True)
            .join(pools, on="replica", how="left")
            .group_by("pool", "minute_ts")
            .agg(
                replicas=pl.col("replica").n_unique().cast(pl.Float64),
                running=pl.col("running").sum(),
                waiting=pl.col("waiting").sum(),
                kv_usage_ratio=pl.col("kv").mean(),
            )
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        minutes = self.pool_minutes(inputs).collect()
        if minutes.is_empty():
            return []
        episodes = flagged_episodes(
            minutes.lazy(),
            by=["pool"],
            flag="flagged",
            max_gap_minutes=self.max_gap_minutes,
            min_minutes=self.min_minutes,
        ).collect()
        if episodes.is_empty():
            return []
        judged = minutes.filter(pl.col("reached") > 0).height
        engines = self.engine_minutes(inputs).collect()
        models = self.model_minutes(inputs).collect()
        return [
            self._finding(
                str(row["pool"]),
                row["start"],
                row["end"],
                minutes=minutes,
                engines=engines,
                models=models,
                judged=judged,
                inputs=inputs,
            )
            for row in episodes.iter_rows(named=True)
        ]

    def _load(self, engines: pl.DataFrame, pool: str, start: datetime, last: datetime) -> _Load:
        """The engines behind the gateway: the pool's replicas (every replica when the gateway
        names no pool), during [start, last) and over the baseline minutes before."""
        scoped = engines if pool == "" else engines.filter(pl.col("pool") == pool)
        during = scoped.filter(pl.col("minute_ts").is_between(start, last, closed="left"))
        before = scoped.filter(
            pl.col("minute_ts").is_between(
                start - self.baseline_minutes * MINUTE, start, closed="left"
            )
        )

        def per_replica(frame: pl.DataFrame, column: str) -> float | None:
            replicas = float(frame["replicas"].sum())
            return float(frame[column].sum()) / replicas if replicas > 0 else None

        kv = during["kv_usage_ratio"].mean() if during.height else None
        waiting = per_replica(during, "waiting")
        kv_ratio = float(kv) if isinstance(kv, int | float) else None
        return _Load(
            running=per_replica(during, "running"),
            waiting=waiting,
            kv=kv_ratio,
            running_before=per_replica(before, "running"),
            waiting_before=per_replica(before, "waiting"),
            full=(waiting is not None and waiting >= self.full_waiting_per_replica)
            or (kv_ratio is not None and kv_ratio >= self.full_kv_ratio),
        )

    def _finding(
        self,
        pool: str,
        start: datetime,
        last: datetime,
        *,
        minutes: pl.DataFrame,
        engines: pl.DataFrame,
        models: pl.DataFrame,
        judged: int,
        inputs: HealthInputs,
    ) -> Finding:
        """One finding for the pool's episode [start, last)."""
        span = pl.col("minute_ts").is_between(start, last, closed="left")
        during = minutes.filter((pl.col("pool") == pool) & span)
        first = during.filter(pl.col("flagged")).sort("minute_ts").head(1)
        end = episode_end(last, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes)

        rejected = float(during["rejected"].sum())
        reached = float(during["reached"].sum())
        ratio = rejected / reached if reached > 0 else math.nan
        baseline_reached = float(first["baseline_reached"].sum())
        baseline = (
            float(first["baseline_rejected"].sum()) / baseline_reached
            if baseline_reached >= self.min_baseline_requests
            else None
        )
        reference = float(
            during.select(
                (pl.col("reached") * pl.col("baseline_ratio").fill_null(0.0)).sum()
            ).item()
        )
        tail = (
            binomial_tail(round(rejected), round(reached), reference / reached) if reached else 1.0
        )
        confidence = 1.0 - min(1.0, tail * max(judged, 1))
        flagged_minutes = int(during["flagged"].sum())

        load = self._load(engines, pool, start, last)
        running, waiting, kv, full = load.running, load.waiting, load.kv, load.full
        known = running is not None or waiting is not None

        refused = (
            models.filter((pl.col("pool") == pool) & span)
            .group_by("model_name")
            .agg(
                pl.col("rejected").sum(), reached=pl.col("routed").sum() + pl.col("rejected").sum()
            )
            .with_columns(share=pl.col("rejected") / pl.col("reached"))
            .sort("model_name")
        )
        spared = refused.filter(pl.col("share") < self.min_share_increase)["model_name"].to_list()
        hit = refused.filter(pl.col("share") >= self.min_share_increase)["model_name"].to_list()

        def nan(value: float | None) -> float:
            return math.nan if value is None else value

        evidence = [
            Evidence("rejected_ratio", ratio, "ratio", baseline=baseline),
            Evidence("rejected_requests", rejected, "count"),
            Evidence("gateway_requests", reached, "count"),
            Evidence("rejection_minutes", float(flagged_minutes), "count"),
            Evidence(
                "requests_running_per_replica", nan(running), "count", baseline=load.running_before
            ),
            Evidence(
                "requests_waiting_per_replica", nan(waiting), "count", baseline=load.waiting_before
            ),
            Evidence("kv_cache_usage_ratio", nan(kv), "ratio"),
        ]
        when = (
            f"for {round((last - start) / MINUTE)} minutes from {start:%H:%M} until {last:%H:%M}"
            if end is not None
            else f"since {start:%H:%M}, still refusing at the window's end"
        )
        base_text = "no baseline" if baseline is None else f"baseline {baseline:.1%}"
        if not known:
            engines_text = "the replicas' load is unknown"
        elif full:
            engines_text = (
                f"its replicas were full ({nan(running):.1f} running and {nan(waiting):.1f} "
                "waiting per replica)"
            )
        else:
            engines_text = (
                f"its replicas had room ({nan(running):.1f} running and {nan(waiting):.1f} "
                "waiting per replica)"
            )
        scope_unit, scope = (ScopeUnit.POOL, pool) if pool else (ScopeUnit.FLEET, "fleet")
        name = f"pool {pool}" if pool else "the fleet"
        summary = (
            f"{name}: the gateway refused {ratio:.0%} of the requests that reached it "
            f"({rejected:.0f} of {reached:.0f}, {base_text}) {when}; {engines_text}"
        )
        if full:
            suggestion = (
                "the pool is at capacity: add replicas (or let the autoscaler add them sooner); "
                "raising the gateway's limit alone would move the wait into the replicas' queues"
            )
        elif known:
            suggestion = (
                "the replicas had room, so the gateway's limit (rate limit, flow-control or "
                "admission quota) is set below what the pool serves: raise it to the pool's "
                "capacity"
            )
        else:
            suggestion = "raise the gateway's limit or the pool's capacity"
        if spared and hit:
            evidence.append(
                Evidence("refused_models", float(len(hit)), "count", baseline=float(refused.height))
            )
            summary += f"; only {', '.join(hit)} were refused"
            suggestion += (
                f"; only {', '.join(hit)} were refused while {', '.join(spared)} passed: give "
                "them a per-tenant quota (an objective's priority or its own limit) rather than "
                "one limit for all"
            )
        return Finding(
            kind=self.kind,
            scope_unit=scope_unit,
            scope=scope,
            start=start,
            end=end,
            confidence=round(min(max(confidence, 0.0), 1.0), 4),
            summary=summary,
            evidence=tuple(evidence),
            suggestion=suggestion,
        )
