"""The KV-pool pressure detector: a replica whose paged KV pool runs full, so the scheduler
preempts running requests (recomputing them later) and admits new ones late: time per output
token rises for the requests it holds, and time to first token for those waiting for room.

Per replica and minute it reads the KV-cache usage gauge (its maximum over the minute's
scrapes), the preemptions counter and the p90 time per output token and to first token. A
pressure minute has usage at or above `usage_threshold` and at least `min_preemptions`
preemptions; pressure minutes bridged over gaps of up to `max_gap_minutes` form an episode of
at least `min_minutes`. One finding per replica covers all its episodes: from the first one's
start to the last one's end (None while the last is still going at the window's end), with how
many episodes, how long each lasted in all and at most, the preemptions, and TPOT and TTFT during
pressure against the replica's own outside it.

Confidence: full usage and preemptions are the engine's own readings, so a finding starts at
0.5; the other half is the share of its pressure minutes in which TPOT or TTFT was at least
`rise_ratio` times the replica's baseline, i.e. how consistently users felt it. A squeezed pool
often hurts TTFT more than TPOT (requests wait for blocks rather than decode slower), so either
counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from servewatch.health.episodes import episode_end, flagged_episodes
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
)
from servewatch.pipeline.signals import Signal


@dataclass(frozen=True)
class KvPressureDetector:
    """Thresholds (defaults in brackets):
    - `usage_threshold` [0.8]: KV-cache usage that counts as near full at some scrape of a
      preempting minute (a scrape rarely lands on the instant the pool is full; vLLM
      preempts only when it is, so preemptions prove the rest);
    - `min_preemptions` [1]: preemptions a minute needs besides full usage;
    - `min_minutes` [2], `max_gap_minutes` [2]: an episode's length and bridged gaps;
    - `rise_ratio` [1.2]: TPOT or TTFT over the replica's baseline that counts as felt.
    """

    usage_threshold: float = 0.8
    min_preemptions: float = 1.0
    min_minutes: int = 2
    max_gap_minutes: int = 2
    rise_ratio: float = 1.2
    kind: FindingKind = FindingKind.KV_PRESSURE

    def replica_minutes(self, inputs: HealthInputs) -> pl.LazyFrame:
        """Per replica-minute: kv_usage_mean/max, preemptions, tpot_p90_s, pressure flag."""
        start, end = inputs.start, inputs.end
        points, dims = inputs.points, inputs.dimensions
        usage = gauge_minutes(
            points, dims, signal=Signal.KV_CACHE_USAGE_RATIO, name="kv_usage", start=start, end=end
        )
        preemptions = counter_increase_minutes(
            points, dims, signal=Signal.PREEMPTIONS, name="preemptions", start=start, end=end
        )
        tpot = quantile_minutes(
            points,
            dims,
            signal=Signal.REQUEST_TPOT_S,
            q=0.9,
            name="tpot_p90_s",
            start=start,
            end=end,
        )
        ttft = quantile_minutes(
            points, dims, signal=Signal.TTFT_S, q=0.9, name="ttft_p90_s", start=start, end=end
        )
        on = ["replica", "minute_ts"]
        return (
            usage.join(preemptions, on=on, how="left")
            .join(tpot, on=on, how="left")
            .join(ttft, on=on, how="left")
            .with_columns(pl.col("preemptions").fill_null(0.0))
            .with_columns(
                pressure=(pl.col("kv_usage_max") >= self.usage_threshold)
                & (pl.col("preemptions") >= self.min_preemptions)
            )
            .sort(on)
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        minutes = self.replica_minutes(inputs).collect()
        episodes = flagged_episodes(
            minutes.lazy(),
            by=["replica"],
            flag="pressure",
            max_gap_minutes=self.max_gap_minutes,
            min_minutes=self.min_minutes,
        ).collect()
        findings = []
        for (replica,), runs in episodes.group_by("replica", maintain_order=True):
            mine = minutes.filter(pl.col("replica") == replica)
            inside = pl.any_horizontal(
                pl.col("minute_ts").is_between(start, end, closed="left")
                for start, end in runs.select("start", "end").iter_rows()
            )
            during = mine.filter(inside & pl.col("pressure"))
            outside = mine.filter(~inside)
            findings.append(self._finding(str(replica), runs, during, outside, inputs))
        return findings

    def _finding(
        self,
        replica: str,
        runs: pl.DataFrame,
        during: pl.DataFrame,
        outside: pl.DataFrame,
        inputs: HealthInputs,
    ) -> Finding:
        durations_s = [
            (end - start).total_seconds() for start, end in runs.select("start", "end").iter_rows()
        ]
        start: datetime = runs["start"].min()  # type: ignore[assignment]
        last_end: datetime = runs["end"].max()  # type: ignore[assignment]
        preemptions = float(during["preemptions"].sum())
        tpot_during = during["tpot_p90_s"].drop_nulls().median()
        tpot_baseline = outside["tpot_p90_s"].drop_nulls().median()
        ttft_during = during["ttft_p90_s"].drop_nulls().median()
        ttft_baseline = outside["ttft_p90_s"].drop_nulls().median()
        felt = float(
            during.select(
                (
                    self._rose("tpot_p90_s", _float(tpot_baseline))
                    | self._rose("ttft_p90_s", _float(ttft_baseline))
                ).mean()
            ).item()
            or 0.0
        )
        evidence = [
            Evidence("episodes", float(runs.height), "count"),
            Evidence("pressure_s", float(during.height * 60), "s"),
            Evidence("longest_episode_s", max(durations_s), "s"),
            Evidence("preemptions", preemptions, "count"),
            Evidence(
                "preemptions_per_min", preemptions / max(during.height, 1), "count", baseline=0.0
            ),
            Evidence(
                "kv_usage_ratio",
                float(during["kv_usage_mean"].mean()),  # type: ignore[arg-type]
                "ratio",
                baseline=_float(outside["kv_usage_mean"].mean()),
            ),
        ]
        if tpot_during is not None:
            evidence.append(
                Evidence("tpot_p90_s", float(tpot_during), "s", baseline=_float(tpot_baseline))  # type: ignore[arg-type]
            )
        if ttft_during is not None:
            evidence.append(
                Evidence("ttft_p90_s", float(ttft_during), "s", baseline=_float(ttft_baseline))  # type: ignore[arg-type]
            )
        tpot_text = ""
        for name, now, before in (
            ("TPOT", tpot_during, tpot_baseline),
            ("TTFT", ttft_during, ttft_baseline),
        ):
            if now is not None and before is not None:
                now_ms, before_ms = float(now) * 1000, float(before) * 1000  # type: ignore[arg-type]
                tpot_text += f"; {name} p90 {now_ms:.0f} ms vs {before_ms:.0f} ms outside"
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.REPLICA,
            scope=replica,
            start=start,
            end=episode_end(last_end, window_end=inputs.end, max_gap_minutes=self.max_gap_minutes),
            confidence=round(0.5 + 0.5 * felt, 4),
            summary=(
                f"{replica}'s KV pool ran full {runs.height} time(s) for {during.height} "
                f"minutes in all (longest {max(durations_s) / 60:.0f} min), with "
                f"{preemptions:.0f} preemptions" + tpot_text
            ),
            evidence=tuple(evidence),
            suggestion=(
                f"give {replica} more KV room (check what else holds its GPU memory, its "
                "gpu_memory_utilization and max_num_seqs) or route long contexts elsewhere"
            ),
        )

    def _rose(self, column: str, baseline: float | None) -> pl.Expr:
        """Whether a minute's `column` rose to `rise_ratio` times its baseline (false with no
        baseline or no reading)."""
        if baseline is None:
            return pl.lit(value=False)
        return (pl.col(column) >= self.rise_ratio * baseline).fill_null(value=False)


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]
