"""The traffic-step detector: a pool's arrivals rise well above their recent level and stay
there, and the pool's users pay for it in requests that miss the objective. Capacity did not
follow (it takes a decision and a cold start to add a replica), so batches grew, every step
of every engine slowed, and TTFT and TPOT rose, with or without a queue. A rise that does no
harm is not a finding; a rise whose harm lasted until new replicas served is reported as the
autoscaler's lag (`health.autoscaler_lag`) instead.

Per pool and minute it reads arrivals (traced requests by arrival time when there are any,
else requests finished plus the change in requests held, from the engines' counters and
gauges), completions, serving replicas, waiting requests (summed over the pool's replicas),
requests shed (finished with `abort` or `error`, or refused by admission control) and the
pool's queue time p90. A minute has risen when its arrivals reach `step_ratio` times the
median of the `baseline_minutes` before it (at least `min_baseline_minutes` of them). A step
starts at a risen minute; its baseline is frozen there (a rolling median would catch up with
a long step and end it early) and it lasts while minutes keep rising against that baseline,
gaps of up to `max_gap_minutes` bridged. It needs `min_minutes` risen minutes and mean
arrivals over its whole span of `step_ratio` times the baseline. Its harm is measured over
its span against the baseline minutes (`health.step_harm`); a step with clear harm is a
finding, which ends with the step (None while it has not).

Thresholds, and why: `step_ratio` 1.3 is three standard deviations of Poisson noise at 100
requests a minute, and `min_minutes` 3 is more than a burst of up to 60 s can cover (it
straddles at most two minutes), so short bursts and noise are not steps; a diurnal swing moves
a 10-minute median by a few percent, far under 1.3. The harm bar (`step_harm.HarmRule`) keeps
rises the pool absorbed out.

Confidence: how clear the rise is times how clear the harm is. The rise: 1 - 2^-n for n risen
minutes, times the mean ratio's margin over `step_ratio` (a margin twice the threshold's
counts fully); the harm: `HarmRule.clarity`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl

from servewatch.health.autoscaler_lag import (
    lag_finding,
    lag_span,
    new_replicas,
    replica_service,
)
from servewatch.health.episodes import episode_end
from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
)
from servewatch.health.step_harm import (
    HarmRule,
    HarmSource,
    SpanHarm,
    pool_ttft_buckets,
    traced_requests,
)
from servewatch.pipeline.metric_sli import counter_minutes
from servewatch.pipeline.promql import histogram_quantile_frame
from servewatch.pipeline.replica_minutes import (
    counter_increase_minutes,
    gauge_minutes,
    replica_pools,
)
from servewatch.pipeline.signals import Signal

_SHED_REASONS = ("abort", "error")
MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class Step:
    """A sustained rise of a pool's arrivals: [start, end) in whole minutes, against the
    median of the minutes before it (`baseline_per_min`, from `baseline_from` on)."""

    pool: str
    start: datetime
    end: datetime
    baseline_from: datetime
    baseline_per_min: float
    risen_minutes: int


@dataclass(frozen=True)
class TrafficStepDetector:
    """Thresholds (defaults in brackets):
    - `step_ratio` [1.3]: arrivals over their recent median that make a risen minute, and the
      step's mean arrivals over it;
    - `min_minutes` [3], `max_gap_minutes` [1]: a step's risen minutes and bridged gaps;
    - `baseline_minutes` [10], `min_baseline_minutes` [5]: the median a minute is held
      against, and how many minutes it needs;
    - `harm`: when the step's harm is clear (`step_harm.HarmRule`).
    """

    step_ratio: float = 1.3
    min_minutes: int = 3
    max_gap_minutes: int = 1
    baseline_minutes: int = 10
    min_baseline_minutes: int = 5
    harm: HarmRule = field(default_factory=HarmRule)
    kind: FindingKind = FindingKind.TRAFFIC_STEP

    def pool_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool-minute: replicas (those scraped), arrivals, baseline_arrivals,
        completions, shed, waiting, running, queue_p90_s."""
        start = inputs.start - timedelta(minutes=self.baseline_minutes)
        end = inputs.end
        points, dims = inputs.points, inputs.dimensions
        pools = replica_pools(dims).select("replica", "pool")
        on = ["replica", "minute_ts"]
        finished = counter_increase_minutes(
            points,
            dims,
            signal=Signal.REQUESTS_FINISHED,
            name="finished",
            by_labels=["finished_reason"],
            start=start,
            end=end,
        )
        completions = finished.group_by(on).agg(
            completions=pl.col("finished").sum(),
            shed=pl.col("finished").filter(pl.col("finished_reason").is_in(_SHED_REASONS)).sum(),
        )
        refused = (
            counter_increase_minutes(
                points,
                dims,
                signal=Signal.ADMISSION_REJECTIONS,
                name="refused",
                start=start,
                end=end,
            )
            .group_by(on)
            .agg(pl.col("refused").sum())
        )
        waiting = gauge_minutes(
            points, dims, signal=Signal.REQUESTS_WAITING, name="waiting", start=start, end=end
        )
        running = gauge_minutes(
            points, dims, signal=Signal.REQUESTS_RUNNING, name="running", start=start, end=end
        )
        per_replica = (
            waiting.join(running, on=on, how="full", coalesce=True)
            .join(completions, on=on, how="left")
            .join(refused, on=on, how="left")
            .join(pools, on="replica", how="left")
            .with_columns(pl.col("completions", "shed", "refused").fill_null(0.0))
        )
        per_pool = (
            per_replica.group_by("pool", "minute_ts")
            .agg(
                replicas=pl.col("replica").n_unique(),
                completions=pl.col("completions").sum(),
                shed=pl.col("shed").sum() + pl.col("refused").sum(),
                waiting=pl.col("waiting_mean").sum(),
                running=pl.col("running_mean").sum(),
            )
            .sort("pool", "minute_ts")
        )
        held = pl.col("waiting") + pl.col("running")
        metric_arrivals = pl.col("completions") + (
            held - held.shift(1).over("pool", order_by="minute_ts")
        ).fill_null(0.0)
        traced = self._traced_arrivals(inputs, pools)
        queue = self._queue_p90(inputs, pools, start=start, end=end)
        return (
            per_pool.join(traced, on=["pool", "minute_ts"], how="left")
            .join(queue, on=["pool", "minute_ts"], how="left")
            .with_columns(
                arrivals=pl.coalesce(
                    pl.col("traced_arrivals"), metric_arrivals.clip(lower_bound=0.0)
                )
            )
            .with_columns(
                baseline_arrivals=pl.col("arrivals")
                .rolling_median(
                    window_size=self.baseline_minutes, min_samples=self.min_baseline_minutes
                )
                .shift(1)
                .over("pool", order_by="minute_ts"),
            )
            .drop("traced_arrivals")
        )

    @staticmethod
    def _traced_arrivals(inputs: HealthInputs, pools: pl.LazyFrame) -> pl.LazyFrame:
        requests = inputs.requests.select("replica", "arrival_ts")
        return (
            requests.join(pools, on="replica", how="left")
            .with_columns(
                pl.col("pool").fill_null(""), minute_ts=pl.col("arrival_ts").dt.truncate("1m")
            )
            .group_by("pool", "minute_ts")
            .agg(traced_arrivals=pl.len().cast(pl.Float64))
        )

    @staticmethod
    def _queue_p90(
        inputs: HealthInputs, pools: pl.LazyFrame, *, start: datetime, end: datetime
    ) -> pl.LazyFrame:
        buckets = inputs.dimensions.filter(
            (pl.col("signal") == Signal.QUEUE_TIME_S.value)
            & pl.col("le").is_not_null()
            & pl.col("replica").is_not_null()
        ).select("series_id", "replica", "le")
        summed = (
            counter_minutes(inputs.points, buckets, by=["replica", "le"], name="delta")
            .join(pools, on="replica", how="left")
            .group_by("pool", "minute_ts", "le")
            .agg(pl.col("delta").sum())
            .filter((pl.col("minute_ts") >= start) & (pl.col("minute_ts") < end))
        )
        return (
            histogram_quantile_frame(summed, q=0.9, by=["pool", "minute_ts"], count_column="delta")
            .filter(pl.col("quantile").is_finite())
            .rename({"quantile": "queue_p90_s"})
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        minutes = self.pool_minutes(inputs).collect()
        pools = replica_pools(inputs.dimensions).select("replica", "pool")
        source: HarmSource | None = None
        service: pl.DataFrame | None = None
        findings = []
        for step in self.steps(minutes, window_start=inputs.start):
            if source is None:
                requests = traced_requests(inputs, pools)
                buckets = (
                    pool_ttft_buckets(inputs, pools) if requests.is_empty() else pl.DataFrame()
                )
                source = HarmSource(requests, buckets, limits_given=not inputs.limits.is_empty)
                service = replica_service(inputs, pools)
            pool_minutes = minutes.filter(pl.col("pool") == step.pool)
            finding = self._judge(step, pool_minutes, inputs, source, service)
            if finding is not None:
                findings.append(finding)
        return findings

    def steps(self, minutes: pl.DataFrame, *, window_start: datetime) -> list[Step]:
        """The steps in a `pool_minutes` frame that start in the window."""
        first = window_start.replace(second=0, microsecond=0)
        found: list[Step] = []
        for (pool,), rows in minutes.sort("minute_ts").group_by("pool", maintain_order=True):
            ts: list[datetime] = rows["minute_ts"].to_list()
            arrivals: list[float] = rows["arrivals"].to_list()
            baselines: list[float | None] = rows["baseline_arrivals"].to_list()
            i = 0
            while i < len(ts):
                step = self._step_from(
                    str(pool), i=i, ts=ts, arrivals=arrivals, baseline=baselines[i], first=first
                )
                if step is None:
                    i += 1
                    continue
                found.append(step)
                i = ts.index(step.end - MINUTE) + 1
        return found

    def _step_from(
        self,
        pool: str,
        *,
        i: int,
        ts: list[datetime],
        arrivals: list[float],
        baseline: float | None,
        first: datetime,
    ) -> Step | None:
        if ts[i] < first or baseline is None or baseline <= 0:
            return None
        bar = self.step_ratio * baseline
        if arrivals[i] < bar:
            return None
        risen = [i]
        bridge = timedelta(minutes=self.max_gap_minutes + 1)
        for k in range(i + 1, len(ts)):
            if ts[k] - ts[risen[-1]] > bridge:
                break
            if arrivals[k] >= bar:
                risen.append(k)
        span = arrivals[i : risen[-1] + 1]
        if len(risen) < self.min_minutes or sum(span) / len(span) < bar:
            return None
        return Step(
            pool=pool,
            start=ts[i],
            end=ts[risen[-1]] + MINUTE,
            baseline_from=ts[i] - timedelta(minutes=self.baseline_minutes),
            baseline_per_min=baseline,
            risen_minutes=len(risen),
        )

    def _judge(
        self,
        step: Step,
        minutes: pl.DataFrame,
        inputs: HealthInputs,
        source: HarmSource,
        service: pl.DataFrame | None,
    ) -> Finding | None:
        baseline_span = (step.baseline_from, step.start)
        harm = source.measure(
            step.pool, minutes, span=(step.start, step.end), baseline=baseline_span
        )
        clarity = self._clarity(harm, inputs)
        if clarity == 0.0:
            return None
        during = minutes.filter(pl.col("minute_ts").is_between(step.start, step.end, closed="left"))
        before = minutes.filter(pl.col("minute_ts").is_between(*baseline_span, closed="left"))
        mean_ratio = float(during["arrivals"].mean()) / step.baseline_per_min  # type: ignore[arg-type]
        rise = (1.0 - 0.5**step.risen_minutes) * min(
            1.0, (mean_ratio - 1.0) / (2.0 * (self.step_ratio - 1.0))
        )
        end = episode_end(step.end, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes)
        evidence = self._evidence(step, during, before, harm)
        lag = self._autoscaler_lag(
            step,
            minutes=minutes,
            inputs=inputs,
            source=source,
            service=service,
            end=end,
            evidence=evidence,
            rise=rise,
        )
        if lag is not None:
            return lag
        pool = step.pool
        peak = float(during["arrivals"].max())  # type: ignore[arg-type]
        attained, attained_before = harm.attainment_ratio, harm.baseline_attainment_ratio
        hurt = (
            f"attainment {attained_before:.2f} -> {attained:.2f}"
            if harm.by_limits and attained is not None and attained_before is not None
            else f"TTFT p90 {harm.baseline_ttft_p90_s or 0:.2f} -> {harm.ttft_p90_s or 0:.2f} s"
        )
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.POOL,
            scope=pool,
            start=step.start,
            end=end,
            confidence=round(rise * clarity, 4),
            summary=(
                f"pool {pool or '(none)'}: arrivals stepped x{mean_ratio:.2f} (peak "
                f"{peak / 60:.1f} against {step.baseline_per_min / 60:.1f} requests/s) at "
                f"{step.start:%H:%M} for {(step.end - step.start).total_seconds() / 60:.0f} min "
                f"and capacity did not follow: {harm.bad_requests:.0f} bad requests against "
                f"{harm.expected_bad_requests:.0f} expected, {hurt}"
                + (", still stepped" if end is None else "")
            ),
            evidence=evidence,
            suggestion=(
                "keep warm spare replicas (or scale on arrivals, queue depth and KV use, "
                "leading signals) so a step is absorbed within a cold start; shed with a "
                "retry-after at the gateway rather than queue without bound"
            ),
        )

    def _clarity(self, harm: SpanHarm, inputs: HealthInputs) -> float:
        return self.harm.clarity(
            harm, objective_ratio=inputs.objective_ratio, limits_given=harm.by_limits
        )

    def _autoscaler_lag(
        self,
        step: Step,
        *,
        minutes: pl.DataFrame,
        inputs: HealthInputs,
        source: HarmSource,
        service: pl.DataFrame | None,
        end: datetime | None,
        evidence: tuple[Evidence, ...],
        rise: float,
    ) -> Finding | None:
        """The step as the autoscaler's lag: new replicas served during it and its harm was
        clear until they did."""
        if service is None:
            return None
        added = new_replicas(service, step.pool, start=step.start, until=step.end)
        span = lag_span(step.start, added) if added is not None else None
        if added is None or span is None:
            return None
        baseline_span = (step.baseline_from, step.start)
        lag_harm = source.measure(step.pool, minutes, span=span, baseline=baseline_span)
        lag_clarity = self._clarity(lag_harm, inputs)
        if lag_clarity == 0.0:
            return None
        caught_up = added.all_serving_from.replace(second=0, microsecond=0) + MINUTE
        after_harm = (
            source.measure(step.pool, minutes, span=(caught_up, step.end), baseline=baseline_span)
            if caught_up < step.end
            else None
        )
        after_clarity = 0.0 if after_harm is None else self._clarity(after_harm, inputs)
        return lag_finding(
            pool=step.pool,
            start=step.start,
            end=end,
            added=added,
            lag_harm=lag_harm,
            after_harm=after_harm,
            after_clarity=after_clarity,
            confidence=rise * lag_clarity,
            step_evidence=evidence,
        )

    def _evidence(
        self, step: Step, during: pl.DataFrame, before: pl.DataFrame, harm: SpanHarm
    ) -> tuple[Evidence, ...]:
        base = step.baseline_per_min
        peak = float(during["arrivals"].max())  # type: ignore[arg-type]
        mean = float(during["arrivals"].mean())  # type: ignore[arg-type]
        queue_p90 = during["queue_p90_s"].drop_nulls().max()
        evidence = [
            Evidence("arrivals_per_s", peak / 60.0, "requests_per_s", baseline=base / 60.0),
            Evidence("mean_arrivals_per_s", mean / 60.0, "requests_per_s", baseline=base / 60.0),
            Evidence("peak_arrivals_ratio", peak / base, "ratio", baseline=1.0),
            Evidence("mean_arrivals_ratio", mean / base, "ratio", baseline=1.0),
            Evidence("step_s", (step.end - step.start).total_seconds(), "s"),
            Evidence(
                "completions_per_s",
                float(during["completions"].mean()) / 60.0,  # type: ignore[arg-type]
                "requests_per_s",
                baseline=float(before["completions"].median() or 0.0) / 60.0,  # type: ignore[arg-type]
            ),
            Evidence(
                "waiting_requests",
                float(during["waiting"].max() or 0.0),  # type: ignore[arg-type]
                "requests",
                baseline=float(before["waiting"].median() or 0.0),  # type: ignore[arg-type]
            ),
            Evidence("shed_requests", float(during["shed"].sum()), "count", baseline=0.0),
            Evidence("requests", harm.requests, "count", baseline=harm.baseline_requests),
            Evidence(
                "bad_requests", harm.bad_requests, "count", baseline=harm.expected_bad_requests
            ),
            Evidence("excess_bad_requests", harm.excess_bad_requests, "count", baseline=0.0),
        ]
        if harm.attainment_ratio is not None:
            evidence.append(
                Evidence(
                    "attainment_ratio",
                    harm.attainment_ratio,
                    "ratio",
                    baseline=harm.baseline_attainment_ratio,
                )
            )
        if harm.ttft_p90_s is not None:
            evidence.append(
                Evidence("ttft_p90_s", harm.ttft_p90_s, "s", baseline=harm.baseline_ttft_p90_s)
            )
        if queue_p90 is not None:
            evidence.append(Evidence("queue_time_p90_s", float(queue_p90), "s"))  # type: ignore[arg-type]
        return tuple(evidence)
