"""The affinity-loss detector: a replica's prefix-cache hit rate drops after it restarted or
the pool's placement changed, so prompts it used to find cached are prefilled again and
prefill demand jumps (load, not a fault: the autoscaler has to see it as load).

Triggers, per replica: a restart, seen as a counter reset (an engine counter lower than its
previous sample) or a scrape gap (no successful scrape for `gap_intervals` times the
target's usual interval); and a placement change, seen as a new replica joining its pool
within the window (the router's hash ring moves, so the pool's other replicas are triggered).
Triggers closer than `merge_minutes` merge.

For each trigger the baseline is the replica's hit rate (hit tokens / query tokens) over the
`baseline_minutes` before it (before the gap, for a restart). A finding needs the hit rate in
one of the first `onset_minutes` minutes after the trigger to be at least `min_drop` below
the baseline, and the hit rate over the whole loss at least `min_drop / 2` below it. It
lasts until the hit rate over two consecutive minutes is back within `recovery_margin` (or
the baseline's own minute-to-minute spread, if larger) of the baseline; None while it has
not recovered by the window's end. The extra prefill is query tokens/s
times the drop in hit rate, averaged over the loss.

Confidence is 2 Phi(z) - 1 for z = (baseline - hit rate during the loss) / (the baseline's
minute-to-minute standard deviation / sqrt(loss minutes)): how far the loss lies outside the
replica's normal spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import polars as pl

from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
)
from servewatch.pipeline.replica_minutes import counter_increase_minutes, replica_pools
from servewatch.pipeline.signals import Signal

_RESET_SIGNALS = (
    Signal.PREFIX_CACHE_QUERIES_TOKENS,
    Signal.PROMPT_TOKENS,
    Signal.GENERATION_TOKENS,
)
_MIN_SPREAD = 0.02  # hit-rate spread floor, so a very steady baseline does not make z explode


@dataclass(frozen=True)
class AffinityLossDetector:
    """Thresholds (defaults in brackets):
    - `min_drop` [0.15]: hit-rate drop (absolute) that makes a finding;
    - `baseline_minutes` [15], `onset_minutes` [3]: before and just after the trigger;
    - `recovery_margin` [0.05]: how close to the baseline counts as recovered;
    - `gap_intervals` [2.5]: a scrape gap this many usual intervals long is a restart;
    - `merge_minutes` [5]: triggers of one replica closer than this are one;
    - `min_baseline_tokens` [1000]: query tokens the baseline needs to be trusted.
    """

    min_drop: float = 0.15
    baseline_minutes: int = 15
    onset_minutes: int = 3
    recovery_margin: float = 0.05
    gap_intervals: float = 2.5
    merge_minutes: int = 5
    min_baseline_tokens: float = 1000.0
    kind: FindingKind = FindingKind.AFFINITY_LOSS

    def triggers(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Columns replica, trigger_ts (serving again / placement changed), down_since_ts
        (last sample before a restart; null for a placement change), cause."""
        dims = inputs.dimensions
        counters = dims.filter(
            pl.col("signal").is_in([s.value for s in _RESET_SIGNALS])
            & pl.col("le").is_null()
            & pl.col("replica").is_not_null()
        ).select("series_id", "replica", "signal")
        previous_value = pl.col("value").shift(1).over("series_id", order_by="ts")
        previous_ts = pl.col("ts").shift(1).over("series_id", order_by="ts")
        resets = (
            inputs.points.join(counters, on="series_id", how="inner")
            .with_columns(previous_value=previous_value, previous_ts=previous_ts)
            .filter(pl.col("value") < pl.col("previous_value"))
            .group_by("replica", "ts")
            .agg(pl.col("previous_ts").min())
            .select(
                "replica",
                trigger_ts=pl.col("ts"),
                down_since_ts=pl.col("previous_ts"),
                cause=pl.lit("restart (counters reset)"),
            )
        )
        # A new version (a rollout, its rollback) is a new process under new labels: its
        # counters start a series of their own rather than falling within the old one. The
        # replica's other series of the signal must have stopped when it began (its last
        # sample before, none in the minute after), so two models served side by side are not
        # read as a restart.
        samples = inputs.points.join(counters, on="series_id", how="inner").select(
            "series_id", "replica", "signal", "ts"
        )
        births = samples.group_by("series_id", "replica", "signal").agg(first_ts=pl.col("ts").min())
        others = samples.join(births, on=["replica", "signal"], how="inner", suffix="_new").filter(
            pl.col("series_id") != pl.col("series_id_new")
        )
        relabelled = (
            others.group_by("series_id_new", "replica", "first_ts")
            .agg(
                down_since_ts=pl.col("ts").filter(pl.col("ts") < pl.col("first_ts")).max(),
                overlapping=pl.col("ts")
                .is_between(pl.col("first_ts"), pl.col("first_ts") + pl.duration(minutes=1))
                .any(),
            )
            .filter(pl.col("down_since_ts").is_not_null() & ~pl.col("overlapping"))
            .group_by("replica", "first_ts")
            .agg(pl.col("down_since_ts").max())
            .select(
                "replica",
                trigger_ts=pl.col("first_ts"),
                down_since_ts="down_since_ts",
                cause=pl.lit("restart (a new version's series)"),
            )
        )
        engines = replica_pools(dims).select("replica", "pool")
        scrape_targets = inputs.targets.filter(pl.col("replica").is_not_null()).select(
            "target_id", "replica"
        )
        ok = (
            inputs.scrapes.filter(pl.col("ok"))
            .join(scrape_targets, on="target_id", how="inner")
            .join(engines, on="replica", how="semi")
            .with_columns(
                step=pl.col("ts") - pl.col("ts").shift(1).over("target_id", order_by="ts")
            )
        )
        usual = ok.group_by("target_id").agg(usual=pl.col("step").median())
        gaps = (
            ok.join(usual, on="target_id", how="left")
            .filter(pl.col("step") > pl.col("usual") * self.gap_intervals)
            .select(
                "replica",
                trigger_ts=pl.col("ts"),
                down_since_ts=pl.col("ts") - pl.col("step"),
                cause=pl.lit("restart (scrape gap)"),
            )
        )
        joined = (
            inputs.targets.filter(
                pl.col("replica").is_not_null()
                & (pl.col("first_seen_ts") > inputs.start)
                & (pl.col("first_seen_ts") < inputs.end)
            )
            .select(pl.col("replica").alias("newcomer"), "pool", "first_seen_ts")
            .join(engines, on="pool", how="inner")
            .filter(pl.col("replica") != pl.col("newcomer"))
            .select(
                "replica",
                trigger_ts=pl.col("first_seen_ts"),
                down_since_ts=pl.lit(None, dtype=pl.Datetime("us")),
                cause=pl.concat_str(pl.lit("placement change ("), "newcomer", pl.lit(" joined)")),
            )
        )
        merge = pl.duration(minutes=self.merge_minutes)
        earlier = pl.col("trigger_ts").shift(1).over("replica", order_by="trigger_ts")
        return (
            pl.concat([resets, relabelled, gaps, joined], how="vertical_relaxed")
            # Of triggers at one instant, the one down longest sets the baseline: a rollback's
            # counters reset against the old version's last sample, before the rollout.
            .sort("replica", "trigger_ts", "down_since_ts", nulls_last=True)
            .filter(earlier.is_null() | (pl.col("trigger_ts") - earlier > merge))
        )

    def hit_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per replica-minute: query_tokens, hit_tokens, hit_ratio."""
        start, end = inputs.start - timedelta(minutes=self.baseline_minutes), inputs.end
        queries = counter_increase_minutes(
            inputs.points,
            inputs.dimensions,
            signal=Signal.PREFIX_CACHE_QUERIES_TOKENS,
            name="query_tokens",
            start=start,
            end=end,
        )
        hits = counter_increase_minutes(
            inputs.points,
            inputs.dimensions,
            signal=Signal.PREFIX_CACHE_HITS_TOKENS,
            name="hit_tokens",
            start=start,
            end=end,
        )
        return (
            queries.join(hits, on=["replica", "minute_ts"], how="left")
            .with_columns(pl.col("hit_tokens").fill_null(0.0))
            .filter(pl.col("query_tokens") > 0)
            .with_columns(hit_ratio=pl.col("hit_tokens") / pl.col("query_tokens"))
            .sort("replica", "minute_ts")
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        triggers = self.triggers(inputs).collect()
        if triggers.is_empty():
            return []
        minutes = self.hit_minutes(inputs).collect()
        findings = []
        for trigger in triggers.iter_rows(named=True):
            finding = self._judge(
                trigger, minutes.filter(pl.col("replica") == trigger["replica"]), inputs
            )
            if finding is not None:
                findings.append(finding)
        return findings

    def _judge(
        self, trigger: dict[str, object], minutes: pl.DataFrame, inputs: HealthInputs
    ) -> Finding | None:
        at = trigger["trigger_ts"]
        down_since = trigger["down_since_ts"] or at
        if not isinstance(at, datetime) or not isinstance(down_since, datetime):
            raise TypeError(f"trigger without a time: {trigger}")
        if at < inputs.start or at >= inputs.end:
            return None
        before = minutes.filter(
            (pl.col("minute_ts") < down_since.replace(second=0, microsecond=0))
            & (pl.col("minute_ts") >= down_since - timedelta(minutes=self.baseline_minutes))
        )
        query_sum = float(before["query_tokens"].sum())
        if before.height < 2 or query_sum < self.min_baseline_tokens:
            return None
        baseline = float(before["hit_tokens"].sum()) / query_sum
        spread = max(float(before["hit_ratio"].std() or 0.0), _MIN_SPREAD)  # type: ignore[arg-type]
        after = minutes.filter(pl.col("minute_ts") >= at.replace(second=0, microsecond=0))
        onset = after.head(self.onset_minutes)
        if onset.is_empty() or baseline - float(onset["hit_ratio"].min()) < self.min_drop:  # type: ignore[arg-type]
            return None
        recovered_at = self._recovery(
            after, baseline=baseline, margin=max(self.recovery_margin, spread)
        )
        loss = after if recovered_at is None else after.filter(pl.col("minute_ts") < recovered_at)
        if loss.is_empty():
            return None
        loss_s = loss.height * 60.0
        hit_during = float(loss["hit_tokens"].sum()) / float(loss["query_tokens"].sum())
        drop = baseline - hit_during
        if drop < self.min_drop / 2:
            # One cold minute after a restart is not a lost affinity: over the whole loss the
            # hit rate must stay well below the baseline too.
            return None
        extra_prefill = (
            float(
                (loss["query_tokens"] * (baseline - loss["hit_ratio"]).clip(lower_bound=0.0)).sum()
            )
            / loss_s
        )
        z = drop / (spread / math.sqrt(loss.height))
        confidence = math.erf(z / math.sqrt(2.0)) if z > 0 else 0.0
        replica = str(trigger["replica"])
        start = at.replace(second=0, microsecond=0)
        down_s = (at - down_since).total_seconds()
        evidence = [
            Evidence("hit_ratio", hit_during, "ratio", baseline=baseline),
            Evidence("hit_ratio_drop", drop, "ratio", baseline=0.0),
            Evidence("extra_prefill_tokens_per_s", extra_prefill, "tokens_per_s", baseline=0.0),
            Evidence(
                "query_tokens_per_s",
                float(loss["query_tokens"].sum()) / loss_s,
                "tokens_per_s",
                baseline=query_sum / (before.height * 60.0),
            ),
            Evidence("loss_s", loss_s, "s"),
        ]
        if down_s > 0:
            evidence.append(Evidence("down_s", down_s, "s"))
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.REPLICA,
            scope=replica,
            start=start,
            end=recovered_at,
            confidence=round(confidence, 4),
            summary=(
                f"{replica}'s prefix-cache hit rate fell from {baseline:.0%} to {hit_during:.0%} "
                f"after a {trigger['cause']} at {at:%H:%M:%S}: {extra_prefill:.0f} extra prefill "
                f"tokens/s " + ("until it recovered" if recovered_at else "and not recovered yet")
            ),
            evidence=tuple(evidence),
            suggestion=(
                "count the extra prefill as load while caches refill (do not eject the replica); "
                "keep the router's hash ring stable across restarts so conversations return"
            ),
        )

    @staticmethod
    def _recovery(after: pl.DataFrame, *, baseline: float, margin: float) -> datetime | None:
        """Start of the first two-minute stretch whose hit rate is back near the baseline."""
        pairs = after.with_columns(
            pair_ratio=(pl.col("hit_tokens") + pl.col("hit_tokens").shift(-1))
            / (pl.col("query_tokens") + pl.col("query_tokens").shift(-1)),
            consecutive=(pl.col("minute_ts").shift(-1) - pl.col("minute_ts"))
            == timedelta(minutes=1),
        ).filter(pl.col("consecutive") & (pl.col("pair_ratio") >= baseline - margin))
        if pairs.is_empty():
            return None
        value = pairs["minute_ts"][0]
        return value if isinstance(value, datetime) else None
