"""The slow-replica detector: a replica whose decode steps are slower than its peers' at the
same batch in the same minutes (a throttled or faulty GPU, a noisy neighbour), so the requests
it holds suffer; and how much slower, read from the best evidence there is.

Per replica and minute it reads the exact mean inter-token latency (the increase of the ITL
histogram's `_sum` over its `_count`: one decode step as each decoding request saw it), the
decode batch per engine step (ITL observations over engine steps, from the iteration-tokens
histogram's `_count`; the running gauge's mean where that histogram is missing) and the
prefill tokens per step (the iteration-tokens `_sum` less the decode tokens). An interpolated
quantile is never used: the pool's typical step sits inside one of vLLM's coarse ITL buckets,
where interpolation invents the number.

Load matching. A slow replica holds more requests and, with them, a different prefill mix per
step (a x3.0 slowdown compared raw reads 3.3 to 3.6x), so latencies are compared at the same
load through the pool's step cost (`health.step_cost`), fitted for each replica over its
*peers'* minutes, leaving out minutes more than `model_outlier_ratio` off the pool's median in
the same minute and then off the first fit (neither the replica nor a slow peer bends it).
Every minute's latency is divided by that curve at its own load; the baseline is the median of
the peers' quotients within `neighbourhood_minutes` of the minute, at a decode batch within
`max_batch_ratio` of its own and in the same loss regime (below). Their ratio is the minute's
slowdown: the curve matches batch and prefill mix, the peers in the same minutes whatever else
the pool went through then, and a median keeps one bad peer out of the baseline. Minutes in
which the replica preempted are left out (`health.kv_pressure` reports them). A minute is slow
at `ratio_threshold`; slow minutes bridged over gaps of up to `max_gap_minutes` form an
episode of at least `min_minutes` slow minutes.

Magnitude. Where requests are traced, each replica-minute also gets its traced TPOT (decode
seconds over decode tokens of the requests decoding in it, vLLM's definition), normalised by
the same curve and held against the peers' traced minutes the same way; the headline
`slowdown_ratio` is the median over the episode's minutes of the traced ratio when at least
`min_traced_minutes` have one, else of the ITL histogram mean's. Both are exact means of the
same decode time; the finding names the one it reports.

Failure domains. Host and zone losses are read from the scrapes by
`dependency_review.domain_losses`, as the dependency review reports them. From a loss's first
failed minute to `recovery_minutes` after its replicas answer again, a pool that had replicas
in the lost domain is in that loss's regime: its survivors are compared only with each other,
in the same minutes, so survivors the loss overloaded alike are not slow (`health.loss_overload`
says they are overloaded). A survivor slower than the other survivors at the same batch is
reported, but never to be ejected while the pool is short of the lost capacity.

Confidence is one minus a binomial tail: how unlikely it is that a replica behaving like its
peers would have this many slow minutes among the episode's minutes, given how often the
pool's own minutes look slow against the same baseline (never taken below 5%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from servewatch.health.dependency_review import domain_losses, window_targets
from servewatch.health.episodes import binomial_tail, episode_end, flagged_episodes
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.health.step_cost import fit_step_cost, step_cost
from servewatch.pipeline.replica_minutes import (
    counter_increase_minutes,
    gauge_minutes,
    histogram_mean_minutes,
    replica_pools,
)
from servewatch.pipeline.request_sli import with_tpot
from servewatch.pipeline.signals import Signal

_MIN_FALSE_ALARM_RATIO = 0.05
TRACED_TPOT = "traced TPOT"
ITL_HISTOGRAM_MEAN = "ITL histogram mean"
_ON = ["replica", "minute_ts"]


@dataclass(frozen=True)
class SlowReplicaDetector:
    """Thresholds (defaults in brackets):
    - `ratio_threshold` [1.3]: a minute is slow at this multiple of its peers at its load
      (exact means of one replica-minute vary by under 20% between healthy peers);
    - `min_minutes` [5], `max_gap_minutes` [2]: an episode's length and bridged gaps;
    - `min_pool_replicas` [3]: fewer replicas with data in a pool give no trustworthy curve;
    - `neighbourhood_minutes` [2]: peers' minutes this close count as the same minutes;
    - `max_batch_ratio` [2]: a peer minute's decode batch within this factor counts as the
      same batch;
    - `min_peer_minutes` [3], `min_peer_replicas` [2]: what a baseline needs;
    - `min_tokens_per_minute` [20]: decode tokens a replica-minute needs to be judged;
    - `min_traced_minutes` [3]: episode minutes with a traced ratio for traces to give the
      magnitude;
    - `model_outlier_ratio` [1.4]: peer minutes this far off the pool's median in the same
      minute, then off the first step-cost fit, are left out of the curve;
    - `recovery_minutes` [5]: a loss's regime outlasts its end by this much (survivors drain
      their queues while the lost replicas warm up);
    - `min_host_targets` [2]: as `DependencyReview`'s, for telling a host loss from a fault.
    """

    ratio_threshold: float = 1.3
    min_minutes: int = 5
    max_gap_minutes: int = 2
    min_pool_replicas: int = 3
    neighbourhood_minutes: int = 2
    max_batch_ratio: float = 2.0
    min_peer_minutes: int = 3
    min_peer_replicas: int = 2
    min_tokens_per_minute: float = 20.0
    min_traced_minutes: int = 3
    model_outlier_ratio: float = 1.4
    recovery_minutes: int = 5
    min_host_targets: int = 2
    kind: FindingKind = FindingKind.SLOW_REPLICA

    def load_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per judged replica-minute: pool, decode_tokens, itl_mean_s, decode_batch,
        prefill_tokens_per_step (0 without the iteration-tokens histogram), running_mean;
        minutes with preemptions or too few decode tokens are left out."""
        start, end = inputs.start, inputs.end
        points, dims = inputs.points, inputs.dimensions
        itl = histogram_mean_minutes(
            points,
            dims,
            signal=Signal.INTER_TOKEN_LATENCY_S,
            name="itl_mean_s",
            count_name="decode_tokens",
            start=start,
            end=end,
        )
        steps = histogram_mean_minutes(
            points,
            dims,
            signal=Signal.ITERATION_TOKENS,
            name="tokens_per_step",
            count_name="steps",
            start=start,
            end=end,
        )
        running = gauge_minutes(
            points, dims, signal=Signal.REQUESTS_RUNNING, name="running", start=start, end=end
        )
        preemptions = counter_increase_minutes(
            points, dims, signal=Signal.PREEMPTIONS, name="preemptions", start=start, end=end
        )
        per_step = pl.col("decode_tokens") / pl.col("steps")
        return (
            itl.join(steps, on=_ON, how="left")
            .join(running, on=_ON, how="left")
            .join(preemptions, on=_ON, how="left")
            .join(replica_pools(dims).select("replica", "pool"), on="replica", how="left")
            .filter(
                (pl.col("decode_tokens") >= self.min_tokens_per_minute)
                & (pl.col("preemptions").fill_null(0) <= 0)
            )
            .with_columns(
                decode_batch=pl.coalesce(per_step, pl.col("running_mean")),
                prefill_tokens_per_step=(pl.col("tokens_per_step") - per_step)
                .clip(lower_bound=0.0)
                .fill_null(0.0),
            )
            .filter(pl.col("decode_batch") > 0)
            .select(
                "replica",
                "pool",
                "minute_ts",
                "decode_tokens",
                "itl_mean_s",
                "decode_batch",
                "prefill_tokens_per_step",
                "running_mean",
            )
        )

    def traced_minutes(self, requests: pl.LazyFrame) -> pl.LazyFrame:
        """Per replica-minute of traced requests: traced_tokens (decode tokens) and
        traced_tpot_s (their decode seconds over them). A request counts in the minute its
        decode was halfway through."""
        decode_tokens = pl.col("completion_tokens") - 1
        decode_s = pl.col("tpot_s") * decode_tokens
        halfway = pl.col("end_ts") - pl.duration(microseconds=(decode_s * 500_000).cast(pl.Int64))
        return (
            with_tpot(requests)
            .filter(
                pl.col("ok").fill_null(value=False)
                & pl.col("replica").is_not_null()
                & pl.col("tpot_s").is_not_null()
            )
            .with_columns(
                minute_ts=halfway.dt.truncate("1m"), _tokens=decode_tokens, _decode_s=decode_s
            )
            .group_by(_ON)
            .agg(traced_tokens=pl.col("_tokens").sum(), _decode_s=pl.col("_decode_s").sum())
            .filter(pl.col("traced_tokens") >= self.min_tokens_per_minute)
            .select(
                *_ON, "traced_tokens", traced_tpot_s=pl.col("_decode_s") / pl.col("traced_tokens")
            )
        )

    def loss_regimes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per pool: one row per host or zone loss that took replicas of it: domain (e.g.
        `zone zone-a`), regime_start_ts (its first failed minute) and regime_end_ts
        (`recovery_minutes` after its replicas answered again; the window's end while none
        has)."""
        targets = window_targets(inputs.targets, start=inputs.start, end=inputs.end)
        scrapes = inputs.scrapes.filter(
            (pl.col("ts") >= inputs.start) & (pl.col("ts") < inputs.end)
        )
        placed = replica_pools(inputs.dimensions)
        regimes = []
        for unit, runs in domain_losses(scrapes, targets, min_host_targets=self.min_host_targets):
            pools = placed.select(pl.col(unit.value).alias("domain"), "pool").unique()
            regimes.append(
                runs.lazy()
                .join(pools, on="domain", how="inner")
                .select(
                    "pool",
                    domain=pl.lit(f"{unit.value} ") + pl.col("domain"),
                    regime_start_ts=pl.col("start_ts"),
                    regime_end_ts=pl.coalesce(
                        pl.col("end_ts") + pl.duration(minutes=self.recovery_minutes),
                        pl.lit(inputs.end),
                    ),
                )
            )
        return pl.concat(regimes).unique()

    def step_costs(self, minutes: pl.LazyFrame) -> pl.LazyFrame:
        """Per replica: its pool's step cost (a, b, c) fitted on its *peers'* minutes, so a
        slow replica never bends its own curve. A slow peer must not either: peer minutes more
        than `model_outlier_ratio` off the pool's median latency in the same minute are left
        out of the first fit, and those that far off the first fit out of the second."""
        limit = math.log(self.model_outlier_ratio)
        same_minute = pl.col("itl_mean_s").median().over("pool", "minute_ts")
        peers = (
            minutes.filter((pl.col("itl_mean_s") / same_minute).log().abs() <= limit)
            .join(
                minutes.select("pool", pl.col("replica").alias("judged")).unique(),
                on="pool",
                how="inner",
            )
            .filter(pl.col("replica") != pl.col("judged"))
        )
        first = fit_step_cost(peers, by="judged")
        expected = step_cost(pl.col("decode_batch"), pl.col("prefill_tokens_per_step"))
        typical = (
            peers.join(first, on="judged", how="inner")
            .filter((pl.col("itl_mean_s") / expected).log().abs() <= limit)
            .drop("a", "b", "c")
        )
        return fit_step_cost(typical, by="judged").rename({"judged": "replica"})

    def replica_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per judged replica-minute: the `load_minutes` columns, the replica's step cost
        (a, b, c; `step_costs`) and expected_itl_s at the minute's load, regime (the start of
        the loss whose regime it is in, null outside losses) and lost_domains, the traced
        columns, the peers' baseline (peer_minutes, peer_replicas, peer_batch), itl_ratio (the
        minute's slowdown from the ITL histogram mean), traced_ratio (from traced TPOT, where
        there are traces) and the `slow` flag."""
        minutes = self.load_minutes(inputs)
        sizes = minutes.group_by("pool").agg(pool_replicas=pl.col("replica").n_unique())
        minutes = (
            minutes.join(sizes, on="pool", how="left")
            .filter(pl.col("pool_replicas") >= self.min_pool_replicas)
            .collect()
            .lazy()
        )
        regimes = self.loss_regimes(inputs)
        in_regime = (
            minutes.select("pool", "minute_ts")
            .unique()
            .join(regimes, on="pool", how="inner")
            .filter(
                (pl.col("minute_ts") >= pl.col("regime_start_ts"))
                & (pl.col("minute_ts") < pl.col("regime_end_ts"))
            )
            .group_by("pool", "minute_ts")
            .agg(
                regime=pl.col("regime_start_ts").min(),
                lost_domains=pl.col("domain").unique().sort().str.join(", "),
            )
        )
        minutes = (
            minutes.join(self.step_costs(minutes), on="replica", how="inner")
            .with_columns(
                expected_itl_s=step_cost(pl.col("decode_batch"), pl.col("prefill_tokens_per_step"))
            )
            .join(in_regime, on=["pool", "minute_ts"], how="left")
            .join(self.traced_minutes(inputs.requests), on=_ON, how="left")
            .collect()
            .lazy()
        )
        baseline_ok = (pl.col("peer_minutes") >= self.min_peer_minutes) & (
            pl.col("peer_replicas") >= self.min_peer_replicas
        )
        traced_ok = (pl.col("traced_peer_minutes") >= self.min_peer_minutes) & (
            pl.col("traced_peer_replicas") >= self.min_peer_replicas
        )
        return (
            minutes.join(self.peer_baseline(minutes), on=_ON, how="left")
            .with_columns(
                itl_ratio=pl.when(baseline_ok).then(
                    pl.col("itl_mean_s") / pl.col("expected_itl_s") / pl.col("peer_itl_q")
                ),
                traced_ratio=pl.when(traced_ok).then(
                    pl.col("traced_tpot_s") / pl.col("expected_itl_s") / pl.col("peer_traced_q")
                ),
            )
            .with_columns(slow=pl.col("itl_ratio") >= self.ratio_threshold)
            .sort("replica", "minute_ts")
        )

    def peer_baseline(self, minutes: pl.LazyFrame) -> pl.LazyFrame:
        """Per replica-minute: the median over its peers' minutes at the same batch, in the
        same minutes and loss regime, of their latency over the replica's step cost at *their*
        load (peer_itl_q from the ITL means, peer_traced_q from the traces)."""
        reach = self.neighbourhood_minutes
        offsets = pl.LazyFrame({"_offset": list(range(-reach, reach + 1))})
        peers = (
            minutes.select(
                "pool",
                "regime",
                pl.col("replica").alias("peer"),
                pl.col("minute_ts").alias("_peer_ts"),
                pl.col("decode_batch").alias("_peer_batch"),
                pl.col("prefill_tokens_per_step").alias("_peer_prefill"),
                pl.col("itl_mean_s").alias("_peer_itl_s"),
                pl.col("traced_tpot_s").alias("_peer_tpot_s"),
            )
            .join(offsets, how="cross")
            .with_columns(minute_ts=pl.col("_peer_ts") + pl.duration(minutes=pl.col("_offset")))
        )
        batch_ratio = pl.col("_peer_batch") / pl.col("decode_batch")
        at_their_load = step_cost(pl.col("_peer_batch"), pl.col("_peer_prefill"))
        traced = pl.col("_peer_tpot_s").is_not_null()
        return (
            minutes.select(*_ON, "pool", "regime", "decode_batch", "a", "b", "c")
            .join(peers, on=["pool", "regime", "minute_ts"], how="inner", nulls_equal=True)
            .filter(
                (pl.col("peer") != pl.col("replica"))
                & (batch_ratio <= self.max_batch_ratio)
                & (batch_ratio >= 1 / self.max_batch_ratio)
            )
            .group_by(_ON)
            .agg(
                peer_itl_q=(pl.col("_peer_itl_s") / at_their_load).median(),
                peer_traced_q=(pl.col("_peer_tpot_s") / at_their_load).median(),
                peer_minutes=pl.len(),
                peer_replicas=pl.col("peer").n_unique(),
                peer_batch=pl.col("_peer_batch").median(),
                traced_peer_minutes=traced.sum(),
                traced_peer_replicas=pl.col("peer").filter(traced).n_unique(),
            )
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
        episode: dict[str, Any],
        during: pl.DataFrame,
        false_alarm: float,
        inputs: HealthInputs,
    ) -> Finding:
        replica = str(episode["replica"])
        pool = str(during["pool"][0])
        slow_minutes = int(during["slow"].sum())
        judged = during.height
        confidence = 1.0 - binomial_tail(slow_minutes, judged, false_alarm)
        peer_itl = pl.col("itl_mean_s") / pl.col("itl_ratio")
        itl_ratio, itl, pool_itl, batch, peer_batch, running = (
            _median(during, expr)
            for expr in (
                pl.col("itl_ratio"),
                pl.col("itl_mean_s"),
                peer_itl,
                pl.col("decode_batch"),
                pl.col("peer_batch"),
                pl.col("running_mean"),
            )
        )
        traced = during.filter(pl.col("traced_ratio").is_not_null())
        evidence: list[Evidence] = []
        if traced.height >= self.min_traced_minutes:
            ratio = _median(traced, pl.col("traced_ratio"))
            value = _median(traced, pl.col("traced_tpot_s"))
            baseline = _median(traced, pl.col("traced_tpot_s") / pl.col("traced_ratio"))
            source = TRACED_TPOT
            evidence += [
                Evidence("slowdown_ratio", ratio, "ratio", baseline=1.0),
                Evidence("slowdown_ratio_traced_tpot", ratio, "ratio", baseline=1.0),
                Evidence("slowdown_ratio_itl_histogram_mean", itl_ratio, "ratio", baseline=1.0),
                Evidence("tpot_traced_s", value, "s", baseline=baseline),
                Evidence("traced_minutes", float(traced.height), "count", baseline=float(judged)),
            ]
        else:
            ratio, value, baseline, source = itl_ratio, itl, pool_itl, ITL_HISTOGRAM_MEAN
            evidence += [
                Evidence("slowdown_ratio", ratio, "ratio", baseline=1.0),
                Evidence("slowdown_ratio_itl_histogram_mean", itl_ratio, "ratio", baseline=1.0),
            ]
        evidence += [
            Evidence("itl_mean_s", itl, "s", baseline=pool_itl),
            Evidence("decode_batch", batch, "requests", baseline=peer_batch),
            Evidence("running_batch", running, "requests"),
            Evidence("slow_minutes", float(slow_minutes), "count", baseline=float(judged)),
            Evidence("peer_replicas", _median(during, pl.col("peer_replicas")), "count"),
        ]
        evidence += _curve(during)
        lost = during.filter(pl.col("regime").is_not_null())
        start, end = episode["start"], episode["end"]
        if not isinstance(start, datetime) or not isinstance(end, datetime):
            raise TypeError(f"episode of {replica} has no start or end: {episode}")
        numbers = f"({value * 1000:.1f} ms vs {baseline * 1000:.1f} ms per token, {source})"
        since = f"for {slow_minutes} of {judged} minutes since {start:%Y-%m-%d %H:%M}"
        if lost.is_empty():
            summary = (
                f"{replica} decodes {ratio:.1f}x slower than its peers at the same batch "
                f"{numbers} {since}"
            )
            suggestion = (
                f"eject {replica} from the pool (drain it and replace or restart it); check its "
                "GPU clocks, temperature and XID errors"
            )
        else:
            domains = ", ".join(sorted(set(lost["lost_domains"].to_list())))
            evidence.append(Evidence("loss_minutes", float(lost.height), "count"))
            summary = (
                f"{replica} decodes {ratio:.1f}x slower than the other survivors of pool "
                f"{pool or '(no pool)'} at the same batch {numbers} {since}, during the loss "
                f"of {domains}"
            )
            suggestion = (
                f"do not eject {replica} while the pool is short of {domains}: it is a survivor "
                "carrying the lost capacity's load, and removing it would shed more; once the "
                "lost replicas serve again, check its GPU clocks, temperature and XID errors "
                "and drain it if it is still slower than its peers"
            )
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.REPLICA,
            scope=replica,
            start=start,
            end=episode_end(end, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes),
            confidence=round(min(max(confidence, 0.0), 1.0), 4),
            summary=summary,
            evidence=tuple(evidence),
            suggestion=suggestion,
        )


def _median(frame: pl.DataFrame, expr: pl.Expr) -> float:
    return float(frame.select(expr.median()).item())


def _curve(during: pl.DataFrame) -> list[Evidence]:
    """The episode's latency against its peers' at its load, per doubling bin of decode
    batch ([0, 2), [2, 4), [4, 8), ...)."""
    curve = (
        during.with_columns(
            batch_bin=pl.col("decode_batch").clip(lower_bound=1.0).log(2).floor().cast(pl.Int32),
            peer_itl_s=pl.col("itl_mean_s") / pl.col("itl_ratio"),
        )
        .group_by("batch_bin")
        .agg(pl.col("itl_mean_s").median(), pl.col("peer_itl_s").median())
        .sort("batch_bin")
    )
    return [
        Evidence(
            f"itl_mean_s_at_batch_{2 ** row['batch_bin'] if row['batch_bin'] > 0 else 0}"
            f"_to_{2 ** (row['batch_bin'] + 1)}",
            float(row["itl_mean_s"]),
            "s",
            baseline=float(row["peer_itl_s"]),
        )
        for row in curve.iter_rows(named=True)
    ]
