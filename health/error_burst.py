"""The error-burst detector: a replica that fails a share of its requests well above both the
rest of its pool and its own recent share, for minutes on end (a GPU throwing XID errors, a
corrupt weight shard, a broken sidecar, a bad config on one host), while its peers serve.

Per replica and minute it reads finished and failed requests: from traced requests (by the
minute they ended, failed when not `ok`) when the replica has traces in the window, else from
vLLM's `request_success_total` counter by `finished_reason`. `error` is a failure. `abort` is
not, unless `count_aborts`: vLLM finishes a request with `abort` when it is cancelled (the
client disconnected or timed out, the gateway gave up on it), which is the client's choice and
follows latency (a slow or saturated replica's clients give up), so counting it would report
every latency problem a second time, as errors of the replica that was merely slow.

A minute is judged against a reference ratio, the largest of
- its own baseline: its failed / finished over the `baseline_minutes` before, left out the
  minutes that were elevated themselves (at least `min_failed_per_minute` failures and a
  ratio `min_ratio_increase` above the error budget), so a burst never becomes its own
  baseline however long it lasts; unknown below `min_baseline_requests` finished requests;
- the healthy rest of its pool in the same minute: the other replicas that are neither
  bursting against their own baselines nor failing their scrapes (unknown below
  `min_baseline_requests`), so replicas bursting together do not hide each other;
- the error budget, 1 - `objective_ratio`: failing within what the SLO allows is never a burst.
It is a burst minute when the replica failed at least `min_failed_per_minute` requests, its
ratio is at least `min_ratio_increase` above the reference, and that many failures are
unlikely at the reference ratio: P(X >= failed) <= `significance` for
X ~ Binomial(finished, reference).

Burst minutes bridged over gaps of up to `max_gap_minutes` form an episode of at least
`min_minutes`: a crash, a rollout restart or a host or zone loss fails its in-flight requests in
one instant, which is one minute, not a burst. Minutes in which the replica's target failed a
scrape (and the minute before, where a dying process's last requests land) are a loss, owned by
the dependency review and the affinity-loss detector, and are never burst minutes.

When at least `pool_share` of a pool's replicas (and at least `min_pool_replicas`) burst in
overlapping episodes, they are one finding at pool scope naming them: a shared cause.

Confidence: 1 - m x P(X >= K), X ~ Binomial(N, p), for the K failures among the episode's N
finished requests and p the episode's mean reference ratio, with m the replica-minutes judged in
the window (a Bonferroni bound: the episode was picked out of all of them), clipped to [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter

import polars as pl

from servewatch.health.episodes import (
    MINUTE,
    binomial_tail,
    binomial_tail_of,
    episode_end,
    flagged_episodes,
    overlapping,
)
from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
)
from servewatch.pipeline.replica_minutes import counter_increase_minutes, replica_pools
from servewatch.pipeline.signals import Signal

_ERROR = "error"
_ABORT = "abort"


def _has_columns(frame: pl.LazyFrame, columns: Sequence[str]) -> bool:
    return set(columns) <= set(frame.collect_schema().names())


@dataclass(frozen=True)
class ErrorBurstDetector:
    """Thresholds (defaults in brackets):
    - `significance` [0.01]: the binomial tail at the reference ratio a burst minute needs;
    - `min_failed_per_minute` [3]: failed requests a burst minute needs (one is not a burst);
    - `min_ratio_increase` [0.05]: how far above the reference (5 percentage points) the
      minute's error ratio must be to matter, however certain;
    - `min_minutes` [2], `max_gap_minutes` [2]: an episode's burst minutes and bridged gaps;
    - `baseline_minutes` [30], `min_baseline_requests` [20]: the own baseline's span and the
      finished requests it (and the healthy rest of the pool) needs to be known;
    - `pool_share` [0.5], `min_pool_replicas` [2]: replicas bursting together that make one
      pool finding;
    - `count_aborts` [False]: whether `abort` counts as failed (see the module docstring).
    """

    significance: float = 0.01
    min_failed_per_minute: int = 3
    min_ratio_increase: float = 0.05
    min_minutes: int = 2
    max_gap_minutes: int = 2
    baseline_minutes: int = 30
    min_baseline_requests: int = 20
    pool_share: float = 0.5
    min_pool_replicas: int = 2
    count_aborts: bool = False
    kind = FindingKind.ERROR_BURST  # a class attribute, not a field: it never varies

    def request_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per replica-minute: replica, pool, minute_ts, finished, failed (floats), from traces
        for replicas traced in the window, else from the finished-requests counter."""
        pools = replica_pools(inputs.dimensions).select("replica", "pool")
        reasons = [_ERROR, _ABORT] if self.count_aborts else [_ERROR]
        counted = (
            counter_increase_minutes(
                inputs.points,
                inputs.dimensions,
                signal=Signal.REQUESTS_FINISHED,
                name="finished",
                by_labels=["finished_reason"],
                start=inputs.start,
                end=inputs.end,
            )
            .group_by("replica", "minute_ts")
            .agg(
                finished=pl.col("finished").sum().cast(pl.Float64),
                failed=pl.col("finished")
                .filter(pl.col("finished_reason").is_in(reasons))
                .sum()
                .cast(pl.Float64),
            )
            .join(pools, on="replica", how="left")
        )
        requests = inputs.requests
        if not _has_columns(requests, ("replica", "end_ts", "ok", "error_type", "pool")):
            return counted.with_columns(pl.col("pool").fill_null("")).select(
                "replica", "pool", "minute_ts", "finished", "failed"
            )
        failed = ~pl.col("ok")
        if not self.count_aborts:
            failed &= pl.col("error_type").fill_null("") != _ABORT
        traced = (
            requests.filter(
                pl.col("replica").is_not_null()
                & (pl.col("end_ts") >= inputs.start)
                & (pl.col("end_ts") < inputs.end)
            )
            .group_by("replica", minute_ts=pl.col("end_ts").dt.truncate("1m"))
            .agg(
                finished=pl.len().cast(pl.Float64),
                failed=failed.sum().cast(pl.Float64),
                traced_pool=pl.col("pool").drop_nulls().first(),
            )
            .join(pools, on="replica", how="left")
            .with_columns(pool=pl.coalesce("pool", "traced_pool"))
            .drop("traced_pool")
        )
        columns = ["replica", "pool", "minute_ts", "finished", "failed"]
        return pl.concat(
            [
                traced.select(columns),
                counted.join(traced.select("replica").unique(), on="replica", how="anti").select(
                    columns
                ),
            ]
        ).with_columns(pl.col("pool").fill_null(""))

    def lost_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per replica-minute in which its target failed a scrape, and the minute before it:
        replica, minute_ts. Empty when the window has no scrape history."""
        scrapes, targets = inputs.scrapes, inputs.targets
        if not _has_columns(scrapes, ("target_id", "ts", "ok")) or not _has_columns(
            targets, ("target_id", "replica")
        ):
            return pl.LazyFrame(schema={"replica": pl.String(), "minute_ts": pl.Datetime("us")})
        failed = (
            scrapes.filter(~pl.col("ok"))
            .select("target_id", minute_ts=pl.col("ts").dt.truncate("1m"))
            .join(
                targets.filter(pl.col("replica").is_not_null()).select("target_id", "replica"),
                on="target_id",
                how="inner",
            )
            .select("replica", "minute_ts")
        )
        return pl.concat(
            [failed, failed.with_columns(pl.col("minute_ts") - MINUTE)], how="vertical_relaxed"
        ).unique()

    def replica_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """`request_minutes` with lost (a failed scrape), error_ratio, own_ratio (own baseline,
        null when unknown), own_burst, rest_finished, rest_failed, rest_ratio (healthy rest of
        the pool), reference_ratio, tail and burst."""
        budget = max(0.0, 1.0 - inputs.objective_ratio)
        lost = self.lost_minutes(inputs).with_columns(lost=pl.lit(value=True))
        minutes = (
            self.request_minutes(inputs)
            .join(lost, on=["replica", "minute_ts"], how="left")
            .with_columns(
                pl.col("lost").fill_null(value=False),
                error_ratio=pl.when(pl.col("finished") > 0).then(
                    pl.col("failed") / pl.col("finished")
                ),
            )
            .sort("replica", "minute_ts")
        )
        # Judged against the budget alone, so that the baseline does not depend on itself.
        elevated = (pl.col("failed") >= self.min_failed_per_minute) & (
            pl.col("error_ratio") >= budget + self.min_ratio_increase
        )
        normal = ~pl.col("lost") & ~elevated.fill_null(value=False)
        window = f"{self.baseline_minutes}m"

        def before(column: str) -> pl.Expr:
            return (
                pl.when(normal)
                .then(pl.col(column))
                .otherwise(0.0)
                .rolling_sum_by("minute_ts", window_size=window, closed="left")
                .over("replica")
            )

        minutes = minutes.with_columns(
            baseline_finished=before("finished"), baseline_failed=before("failed")
        ).with_columns(
            own_ratio=pl.when(pl.col("baseline_finished") >= self.min_baseline_requests).then(
                pl.col("baseline_failed") / pl.col("baseline_finished")
            )
        )
        own_reference = pl.max_horizontal(pl.col("own_ratio").fill_null(0.0), pl.lit(budget))
        minutes = (
            minutes.with_columns(own_reference=own_reference)
            .with_columns(own_tail=binomial_tail_of("failed", "finished", "own_reference"))
            .with_columns(own_burst=self._burst(ratio="own_reference", tail="own_tail"))
        )
        healthy = ~pl.col("lost") & ~pl.col("own_burst")
        pool_minute = ["pool", "minute_ts"]
        minutes = (
            minutes.with_columns(
                _healthy_finished=pl.when(healthy).then(pl.col("finished")).otherwise(0.0),
                _healthy_failed=pl.when(healthy).then(pl.col("failed")).otherwise(0.0),
            )
            .with_columns(
                rest_finished=pl.col("_healthy_finished").sum().over(pool_minute)
                - pl.col("_healthy_finished"),
                rest_failed=pl.col("_healthy_failed").sum().over(pool_minute)
                - pl.col("_healthy_failed"),
            )
            .with_columns(
                rest_ratio=pl.when(pl.col("rest_finished") >= self.min_baseline_requests).then(
                    pl.col("rest_failed") / pl.col("rest_finished")
                )
            )
            .with_columns(
                reference_ratio=pl.max_horizontal(
                    pl.col("own_reference"), pl.col("rest_ratio").fill_null(0.0)
                )
            )
            .with_columns(tail=binomial_tail_of("failed", "finished", "reference_ratio"))
            .with_columns(burst=self._burst(ratio="reference_ratio", tail="tail"))
            .drop("_healthy_finished", "_healthy_failed", "own_reference", "own_tail")
        )
        return minutes.sort("replica", "minute_ts")

    def _burst(self, *, ratio: str, tail: str) -> pl.Expr:
        """A burst minute against the reference ratio in column `ratio`, whose binomial tail
        is in column `tail`."""
        return (
            ~pl.col("lost")
            & (pl.col("failed") >= self.min_failed_per_minute)
            & (pl.col("error_ratio") >= pl.col(ratio) + self.min_ratio_increase)
            & (pl.col(tail) <= self.significance)
        ).fill_null(value=False)

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        minutes = self.replica_minutes(inputs).collect()
        if minutes.is_empty():
            return []
        episodes = (
            flagged_episodes(
                minutes.lazy(),
                by=["replica"],
                flag="burst",
                max_gap_minutes=self.max_gap_minutes,
                min_minutes=self.min_minutes,
            )
            .join(minutes.lazy().select("replica", "pool").unique(), on="replica", how="left")
            .sort("pool", "start", "replica")
            .collect()
        )
        judged = minutes.filter(~pl.col("lost") & (pl.col("finished") > 0)).height
        findings: list[Finding] = []
        for pool, pool_episodes in episodes.group_by("pool", maintain_order=True):
            name = str(pool[0])
            replicas = minutes.filter(pl.col("pool") == name)["replica"].n_unique()
            together = max(self.min_pool_replicas, math.ceil(self.pool_share * replicas))
            for spans in overlapping(_spans(pool_episodes), start=itemgetter(1), end=itemgetter(2)):
                # Together they are one pool finding; otherwise each replica is its own.
                groups = [spans] if len({s[0] for s in spans}) >= together else [[s] for s in spans]
                findings.extend(
                    self._finding(
                        name,
                        group,
                        pool_replicas=replicas,
                        minutes=minutes,
                        judged=judged,
                        inputs=inputs,
                    )
                    for group in groups
                )
        return findings

    def _finding(
        self,
        pool: str,
        spans: Sequence[tuple[str, datetime, datetime]],
        *,
        pool_replicas: int,
        minutes: pl.DataFrame,
        judged: int,
        inputs: HealthInputs,
    ) -> Finding:
        """One finding for the episodes in `spans` (replica, start, end): a replica's, or the
        pool's when there are several."""
        names = sorted({replica for replica, _, _ in spans})
        inside = pl.lit(value=False)
        for replica, span_start, span_end in spans:
            inside |= (pl.col("replica") == replica) & pl.col("minute_ts").is_between(
                span_start, span_end, closed="left"
            )
        during = minutes.filter(inside & ~pl.col("lost"))
        first_minutes = (
            minutes.filter(pl.col("burst") & inside)
            .group_by("replica")
            .agg(pl.col("minute_ts").min())
        )
        burst_minutes = minutes.filter(pl.col("burst") & inside)["minute_ts"].n_unique()
        start = min(span[1] for span in spans)
        last = max(span[2] for span in spans)
        end = episode_end(last, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes)

        failed = float(during["failed"].sum())
        finished = float(during["finished"].sum())
        ratio = failed / finished if finished > 0 else math.nan
        # The rest: the pool's other replicas in the same minutes, left out those bursting or
        # failing their scrapes then, so replicas bursting together do not set the baseline.
        rest = minutes.filter(
            (pl.col("pool") == pool)
            & ~pl.col("replica").is_in(names)
            & pl.col("minute_ts").is_in(during["minute_ts"].unique().implode())
            & ~pl.col("lost")
            & ~pl.col("own_burst")
        )
        rest_finished = float(rest["finished"].sum())
        rest_ratio = float(rest["failed"].sum()) / rest_finished if rest_finished > 0 else None
        baseline = minutes.join(first_minutes, on=["replica", "minute_ts"], how="semi")
        before_finished = float(baseline["baseline_finished"].sum())
        before_ratio = (
            float(baseline["baseline_failed"].sum()) / before_finished
            if before_finished >= self.min_baseline_requests
            else None
        )
        normal_ratio = pl.coalesce("own_ratio", "rest_ratio", pl.lit(0.0))
        expected = float(during.select((pl.col("finished") * normal_ratio).sum()).item())
        excess = failed - expected
        reference = float(
            during.select((pl.col("finished") * pl.col("reference_ratio")).sum()).item()
        )
        tail = (
            binomial_tail(round(failed), round(finished), reference / finished) if finished else 1.0
        )
        confidence = 1.0 - min(1.0, tail * max(judged, 1))

        evidence = [
            Evidence("error_ratio", ratio, "ratio", baseline=rest_ratio),
            Evidence(
                "error_ratio_before",
                math.nan if before_ratio is None else before_ratio,
                "ratio",
            ),
            Evidence("failed_requests", failed, "count"),
            Evidence("finished_requests", finished, "count"),
            Evidence("excess_failed_requests", excess, "count", baseline=expected),
            Evidence("burst_minutes", float(burst_minutes), "count"),
        ]
        rest_text = "no healthy rest" if rest_ratio is None else f"rest of pool {rest_ratio:.1%}"
        span = (
            f"for {round((last - start) / MINUTE)} minutes from {start:%H:%M} until {last:%H:%M}"
            if end is not None
            else f"since {start:%H:%M}, still failing at the window's end"
        )
        pool_name = pool or "(none)"
        if len(names) == 1:
            (replica,) = names
            scope_unit, scope = ScopeUnit.REPLICA, replica
            summary = (
                f"{replica} failed {ratio:.0%} of its requests ({rest_text}) {span}: "
                f"{excess:.0f} failed requests beyond its baseline"
            )
            suggestion = (
                f"drain {replica} and read its logs for the failing requests; check its GPU for "
                "XID errors and replace or restart it if they persist"
            )
        else:
            scope_unit, scope = ScopeUnit.POOL, pool
            evidence.append(
                Evidence("replicas", float(len(names)), "count", baseline=float(pool_replicas))
            )
            summary = (
                f"pool {pool_name}: {len(names)} of {pool_replicas} replicas "
                f"({', '.join(names)}) failed {ratio:.0%} of their requests ({rest_text}) "
                f"{span}: {excess:.0f} failed requests beyond their baseline"
            )
            suggestion = (
                "a burst on several replicas at once points at something they share: check the "
                "last config or image push (roll it back) and the dependencies they call; drain "
                "single replicas only once that is ruled out"
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


def _spans(episodes: pl.DataFrame) -> list[tuple[str, datetime, datetime]]:
    """Episodes as (replica, start, end)."""
    spans = []
    for episode in episodes.iter_rows(named=True):
        replica, start, end = str(episode["replica"]), episode["start"], episode["end"]
        if not isinstance(start, datetime) or not isinstance(end, datetime):
            raise TypeError(f"error-burst episode of {replica} without a start or end: {episode}")
        spans.append((replica, start, end))
    return spans
