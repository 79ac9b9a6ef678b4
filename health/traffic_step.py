"""The traffic-step detector: arrivals rise faster than capacity can follow (a new replica
takes a cold start to serve), so every batch fills, the queue grows and requests wait, until
the step passes, capacity catches up, or the gateway sheds.

Per pool and minute it reads arrivals (traced requests by arrival time when there are any,
else requests finished plus the change in requests held, from the engines' counters and
gauges), completions, waiting requests (summed over the pool's replicas), requests shed
(finished with `abort` or `error`, or refused by admission control) and the pool's queue time
p90. A backlog minute has at least `min_waiting_per_replica` requests waiting per replica;
backlog minutes bridged over gaps of up to `max_gap_minutes` form an episode of at least
`min_minutes`. It is a traffic step when, from `lead_minutes` before the backlog to its end,
some minute's arrivals reach `step_ratio` times the arrivals of the `baseline_minutes`
before that (their median). The finding starts at the first such minute and ends when the
backlog clears (None while it has not); its evidence says how high arrivals went, what the
pool completed meanwhile, how deep and old the queue got, and how many requests were shed.

Confidence: the share of the episode's minutes in which arrivals exceeded completions (the
queue grew because input outran output, not because the engines slowed down), times
1 - 2^-n for n backlog minutes (a backlog of one or two minutes may be a burst, not a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from servewatch.health.episodes import episode_end, flagged_episodes
from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
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


@dataclass(frozen=True)
class TrafficStepDetector:
    """Thresholds (defaults in brackets):
    - `step_ratio` [1.5]: arrivals over their recent median that make a step;
    - `min_waiting_per_replica` [2]: waiting requests per replica that make a backlog;
    - `min_minutes` [2], `max_gap_minutes` [1]: a backlog episode's length and bridged gaps;
    - `baseline_minutes` [10], `lead_minutes` [5]: where the step and its baseline are sought.
    """

    step_ratio: float = 1.5
    min_waiting_per_replica: float = 2.0
    min_minutes: int = 2
    max_gap_minutes: int = 1
    baseline_minutes: int = 10
    lead_minutes: int = 5
    kind: FindingKind = FindingKind.TRAFFIC_STEP

    def pool_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool-minute: replicas, arrivals, completions, shed, waiting, running,
        queue_p90_s, backlog flag."""
        start = inputs.start - timedelta(minutes=self.baseline_minutes + self.lead_minutes)
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
                .rolling_median(window_size=self.baseline_minutes, min_samples=3)
                .shift(1)
                .over("pool", order_by="minute_ts"),
                backlog=pl.col("waiting") >= self.min_waiting_per_replica * pl.col("replicas"),
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
        in_window = minutes.filter(
            pl.col("minute_ts") >= inputs.start.replace(second=0, microsecond=0)
        )
        episodes = flagged_episodes(
            in_window.lazy(),
            by=["pool"],
            flag="backlog",
            max_gap_minutes=self.max_gap_minutes,
            min_minutes=self.min_minutes,
        ).collect()
        findings = []
        for episode in episodes.iter_rows(named=True):
            finding = self._judge(
                episode, minutes.filter(pl.col("pool") == episode["pool"]), inputs
            )
            if finding is not None:
                findings.append(finding)
        return findings

    def _judge(
        self, episode: dict[str, object], minutes: pl.DataFrame, inputs: HealthInputs
    ) -> Finding | None:
        backlog_start, backlog_end = episode["start"], episode["end"]
        if not isinstance(backlog_start, datetime) or not isinstance(backlog_end, datetime):
            raise TypeError(f"backlog episode without a start or end: {episode}")
        lead = backlog_start - timedelta(minutes=self.lead_minutes)
        before = minutes.filter(
            (pl.col("minute_ts") < lead)
            & (pl.col("minute_ts") >= lead - timedelta(minutes=self.baseline_minutes))
        )
        baseline = before["arrivals"].median()
        if baseline is None or float(baseline) <= 0:  # type: ignore[arg-type]
            return None
        baseline_per_min = float(baseline)  # type: ignore[arg-type]
        span = minutes.filter(pl.col("minute_ts").is_between(lead, backlog_end, closed="left"))
        stepped = span.filter(pl.col("arrivals") >= self.step_ratio * baseline_per_min)
        if stepped.is_empty():
            return None
        start: datetime = stepped["minute_ts"].min()  # type: ignore[assignment]
        during = span.filter(pl.col("minute_ts") >= start)
        peak = float(during["arrivals"].max())  # type: ignore[arg-type]
        outran = float((during["arrivals"] > during["completions"]).mean())  # type: ignore[arg-type]
        backlog_minutes = int(episode["flagged_minutes"])  # type: ignore[call-overload]
        confidence = outran * (1.0 - 0.5**backlog_minutes)
        shed = float(during["shed"].sum())
        end = episode_end(backlog_end, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes)
        outcome = "still queueing" if end is None else ("shed" if shed > 0 else "cleared")
        pool = str(episode["pool"])
        queue_p90 = during["queue_p90_s"].drop_nulls().max()
        evidence = [
            Evidence(
                "arrivals_per_s", peak / 60.0, "requests_per_s", baseline=baseline_per_min / 60.0
            ),
            Evidence(
                "completions_per_s",
                float(during["completions"].mean()) / 60.0,  # type: ignore[arg-type]
                "requests_per_s",
                baseline=float(before["completions"].median() or 0.0) / 60.0,  # type: ignore[arg-type]
            ),
            Evidence(
                "waiting_requests",
                float(during["waiting"].max()),  # type: ignore[arg-type]
                "requests",
                baseline=float(before["waiting"].median() or 0.0),  # type: ignore[arg-type]
            ),
            Evidence("backlog_s", backlog_minutes * 60.0, "s"),
            Evidence("time_to_clear_s", (backlog_end - start).total_seconds(), "s"),
            Evidence("shed_requests", shed, "count", baseline=0.0),
        ]
        if queue_p90 is not None:
            evidence.append(Evidence("queue_time_p90_s", float(queue_p90), "s"))  # type: ignore[arg-type]
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.POOL,
            scope=pool,
            start=start,
            end=end,
            confidence=round(confidence, 4),
            summary=(
                f"pool {pool or '(none)'}: arrivals stepped from {baseline_per_min / 60:.1f} to "
                f"{peak / 60:.1f} requests/s at {start:%H:%M}, faster than capacity followed; up "
                f"to {float(during['waiting'].max()):.0f} requests waited; {outcome}"  # type: ignore[arg-type]
                + (f" after {(backlog_end - start).total_seconds() / 60:.0f} min" if end else "")
            ),
            evidence=tuple(evidence),
            suggestion=(
                "keep warm spare replicas (or scale on queue depth and KV use, a leading signal) "
                "so a step is absorbed within a cold start; shed with a retry-after at the gateway "
                "rather than queue without bound"
            ),
        )
