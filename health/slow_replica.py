"""The slow-replica detector: a replica whose decode steps are slower than its pool's at the
same load (a throttled or faulty GPU, a noisy neighbour), so the requests it holds suffer.

Per replica and minute it reads the median inter-token latency (one decode step, so it
reflects the engine's step time directly) and the mean running batch. Load is matched by
batch: running batches fall into doubling bins ([0, 2), [2, 4), [4, 8), ...), and the pool's
curve is the median inter-token latency of the *other* replicas of the pool in each bin, so
the replica under test never sets its own baseline and one bad peer barely moves a median.
Minutes in which the replica preempted requests are left out: KV pressure slows steps for a
reason of its own (`health.kv_pressure` reports it). A minute is slow when the replica's
latency is at least `ratio_threshold` times the pool's at its batch; slow minutes bridged over
gaps of up to `max_gap_minutes` form an episode, which needs `min_minutes` slow minutes.

Confidence is one minus a binomial tail: how unlikely it is that a replica behaving like its
peers would have this many slow minutes among the episode's minutes, given how often the
pool's own minutes look slow against the same baseline (never taken below 5%).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from servewatch.health.episodes import binomial_tail, episode_end, flagged_episodes
from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
)
from servewatch.pipeline.replica_minutes import (
    counter_increase_minutes,
    gauge_minutes,
    quantile_minutes,
    replica_pools,
)
from servewatch.pipeline.signals import Signal

_MIN_FALSE_ALARM_RATIO = 0.05


@dataclass(frozen=True)
class SlowReplicaDetector:
    """Thresholds (defaults in brackets):
    - `ratio_threshold` [1.5]: a minute is slow at this multiple of the pool's latency;
    - `min_minutes` [5], `max_gap_minutes` [2]: an episode's length and bridged gaps;
    - `min_pool_replicas` [3]: fewer replicas with data in a pool give no trustworthy curve;
    - `min_peer_minutes` [3]: peer minutes a batch bin needs to give a baseline;
    - `min_tokens_per_minute` [20]: decode steps a replica-minute needs to be judged.
    """

    ratio_threshold: float = 1.5
    min_minutes: int = 5
    max_gap_minutes: int = 2
    min_pool_replicas: int = 3
    min_peer_minutes: int = 3
    min_tokens_per_minute: float = 20.0
    kind: FindingKind = FindingKind.SLOW_REPLICA

    def replica_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per replica-minute: pool, itl_p50_s, running batch, batch_bin, preemptions, the
        pool's itl at that bin from the other replicas (pool_itl_p50_s) and their ratio."""
        start, end = inputs.start, inputs.end
        points, dims = inputs.points, inputs.dimensions
        itl = quantile_minutes(
            points,
            dims,
            signal=Signal.INTER_TOKEN_LATENCY_S,
            q=0.5,
            name="itl_p50_s",
            start=start,
            end=end,
        )
        steps = counter_increase_minutes(
            points,
            dims,
            signal=Signal.INTER_TOKEN_LATENCY_S,
            name="decode_tokens",
            metric_suffix="_count",
            start=start,
            end=end,
        )
        running = gauge_minutes(
            points, dims, signal=Signal.REQUESTS_RUNNING, name="running", start=start, end=end
        )
        preemptions = counter_increase_minutes(
            points, dims, signal=Signal.PREEMPTIONS, name="preemptions", start=start, end=end
        )
        on = ["replica", "minute_ts"]
        minutes = (
            itl.join(steps, on=on, how="inner")
            .join(running, on=on, how="inner")
            .join(preemptions, on=on, how="left")
            .join(replica_pools(dims).select("replica", "pool"), on="replica", how="left")
            .filter(
                (pl.col("decode_tokens") >= self.min_tokens_per_minute)
                & (pl.col("preemptions").fill_null(0) <= 0)
            )
            .with_columns(
                batch_bin=(pl.col("running_mean").clip(lower_bound=1.0).log(2))
                .floor()
                .cast(pl.Int32)
            )
        )
        # Each replica's baseline comes from its pool peers' minutes in the same batch bin.
        peers = minutes.select(
            "pool",
            "batch_bin",
            pl.col("replica").alias("peer"),
            pl.col("itl_p50_s").alias("peer_itl_s"),
        )
        baseline = (
            minutes.select("replica", "pool", "batch_bin")
            .unique()
            .join(peers, on=["pool", "batch_bin"], how="inner")
            .filter(pl.col("peer") != pl.col("replica"))
            .group_by("replica", "batch_bin")
            .agg(
                pool_itl_p50_s=pl.col("peer_itl_s").median(),
                peer_minutes=pl.len(),
                peer_replicas=pl.col("peer").n_unique(),
            )
            .filter(pl.col("peer_minutes") >= self.min_peer_minutes)
        )
        pool_size = minutes.group_by("pool").agg(pool_replicas=pl.col("replica").n_unique())
        return (
            minutes.join(baseline, on=["replica", "batch_bin"], how="left")
            .join(pool_size, on="pool", how="left")
            .filter(pl.col("pool_replicas") >= self.min_pool_replicas)
            .with_columns(itl_ratio=pl.col("itl_p50_s") / pl.col("pool_itl_p50_s"))
            .with_columns(slow=pl.col("itl_ratio") >= self.ratio_threshold)
            .sort("replica", "minute_ts")
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        minutes = self.replica_minutes(inputs).collect()
        if minutes.is_empty():
            return []
        episodes = flagged_episodes(
            minutes.lazy(),
            by=["replica"],
            flag="slow",
            max_gap_minutes=self.max_gap_minutes,
            min_minutes=self.min_minutes,
        ).collect()
        judged = minutes.filter(pl.col("itl_ratio").is_not_null())
        findings = []
        for episode in episodes.iter_rows(named=True):
            replica = episode["replica"]
            during = judged.filter(
                (pl.col("replica") == replica)
                & pl.col("minute_ts").is_between(episode["start"], episode["end"], closed="left")
            )
            # How often the rest of the pool looks slow against the same kind of baseline:
            # the per-minute false-alarm rate the episode is tested against.
            pool = during["pool"][0]
            others = judged.filter((pl.col("pool") == pool) & (pl.col("replica") != replica))
            false_alarm = max(_MIN_FALSE_ALARM_RATIO, float(others["slow"].mean() or 0.0))  # type: ignore[arg-type]
            findings.append(self._finding(episode, during, false_alarm, inputs))
        return findings

    def _finding(
        self,
        episode: dict[str, object],
        during: pl.DataFrame,
        false_alarm: float,
        inputs: HealthInputs,
    ) -> Finding:
        replica = str(episode["replica"])
        slow_minutes = int(during["slow"].sum())
        judged = during.height
        confidence = 1.0 - binomial_tail(slow_minutes, judged, false_alarm)
        ratio = float(during["itl_ratio"].median())  # type: ignore[arg-type]
        itl = float(during["itl_p50_s"].median())  # type: ignore[arg-type]
        pool_itl = float(during["pool_itl_p50_s"].median())  # type: ignore[arg-type]
        batch = float(during["running_mean"].median())  # type: ignore[arg-type]
        curve = (
            during.group_by("batch_bin")
            .agg(
                pl.col("itl_p50_s").median(),
                pl.col("pool_itl_p50_s").median(),
                minutes=pl.len(),
            )
            .sort("batch_bin")
        )
        evidence = [
            Evidence("itl_ratio_to_pool", ratio, "ratio", baseline=1.0),
            Evidence("itl_p50_s", itl, "s", baseline=pool_itl),
            Evidence("running_batch", batch, "requests"),
            Evidence("slow_minutes", float(slow_minutes), "count", baseline=float(judged)),
        ]
        for row in curve.iter_rows(named=True):
            low = 2 ** row["batch_bin"] if row["batch_bin"] > 0 else 0
            evidence.append(
                Evidence(
                    f"itl_p50_s_at_batch_{low}_to_{2 ** (row['batch_bin'] + 1)}",
                    float(row["itl_p50_s"]),
                    "s",
                    baseline=float(row["pool_itl_p50_s"]),
                )
            )
        start, end = episode["start"], episode["end"]
        if not isinstance(start, datetime) or not isinstance(end, datetime):
            raise TypeError(f"episode of {replica} has no start or end: {episode}")
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.REPLICA,
            scope=replica,
            start=start,
            end=episode_end(end, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes),
            confidence=round(min(max(confidence, 0.0), 1.0), 4),
            summary=(
                f"{replica} decodes {ratio:.1f}x slower than its pool at the same batch "
                f"({itl * 1000:.1f} ms vs {pool_itl * 1000:.1f} ms per token) for "
                f"{slow_minutes} of {judged} minutes since {start:%Y-%m-%d %H:%M}"
            ),
            evidence=tuple(evidence),
            suggestion=(
                f"eject {replica} from the pool (drain it and replace or restart it); check its "
                "GPU clocks, temperature and XID errors"
            ),
        )
