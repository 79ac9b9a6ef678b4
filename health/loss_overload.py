"""Loss overload: the replicas that survive a host or zone loss carry the lost replicas'
requests, so each of them holds more than before and every request on them is slower. They
are overloaded by the loss, not slow: ejecting one would take away a share of what is left.
The finding says so; root-cause grouping files it under the loss it follows.

For each host or zone loss (`dependency_review.domain_losses`), the survivors are the other
replicas of the pools the lost replicas served. Their load is requests held per replica
(running plus waiting, the engine's gauges, averaged over the minutes and the survivors),
during the loss against the `baseline_minutes` before it. Survivors are overloaded when their
load rose to at least `load_ratio` times what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from servewatch.health.dependency_review import domain_losses, replicas_by, window_targets
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit
from servewatch.pipeline.replica_minutes import gauge_minutes, replica_pools
from servewatch.pipeline.signals import Signal


@dataclass(frozen=True)
class LossOverloadDetector:
    """`load_ratio` [1.25]: survivors' load over their load before that makes them overloaded
    (a loss of a fifth of a pool, evenly rerouted, raises it by 1.25x);
    `baseline_minutes` [15]: the minutes before the loss their load is compared with;
    `min_host_targets` [2]: as the dependency review's."""

    kind = FindingKind.LOSS_OVERLOAD  # a class attribute, not a field: it never varies
    load_ratio: float = 1.25
    baseline_minutes: int = 15
    min_host_targets: int = 2

    def held_minutes(self, inputs: HealthInputs) -> pl.DataFrame:
        """Per replica-minute: pool and held (running plus waiting, each a minute's mean)."""
        start = inputs.start - timedelta(minutes=self.baseline_minutes)
        points, dims = inputs.points, inputs.dimensions
        on = ["replica", "minute_ts"]
        running, waiting = (
            gauge_minutes(points, dims, signal=s, name=n, start=start, end=inputs.end)
            for s, n in ((Signal.REQUESTS_RUNNING, "running"), (Signal.REQUESTS_WAITING, "waiting"))
        )
        return (
            running.join(waiting, on=on, how="left")
            .join(replica_pools(dims).select("replica", "pool"), on="replica", how="left")
            .select(
                *on,
                "pool",
                held=pl.col("running_mean") + pl.col("waiting_mean").fill_null(0.0),
            )
            .collect()
        )

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        targets = window_targets(inputs.targets, start=inputs.start, end=inputs.end)
        scrapes = inputs.scrapes.filter(
            (pl.col("ts") >= inputs.start) & (pl.col("ts") < inputs.end)
        )
        losses = domain_losses(scrapes, targets, min_host_targets=self.min_host_targets)
        if all(runs.is_empty() for _, runs in losses):
            return []
        held = self.held_minutes(inputs)
        findings = []
        for unit, runs in losses:
            members = replicas_by(targets, unit)
            for run in runs.iter_rows(named=True):
                lost = members.get(run["domain"], [])
                findings += self._overloads(unit, run, lost, held, window_end=inputs.end)
        return findings

    def _overloads(
        self,
        unit: ScopeUnit,
        run: dict[str, Any],
        lost: list[str],
        held: pl.DataFrame,
        *,
        window_end: datetime,
    ) -> list[Finding]:
        start, end = run["start_ts"], run["end_ts"] or window_end
        pools = held.filter(pl.col("replica").is_in(lost))["pool"].drop_nulls().unique()
        survivors = held.filter(pl.col("pool").is_in(pools) & ~pl.col("replica").is_in(lost))
        during = survivors.filter(pl.col("minute_ts").is_between(start, end, closed="left"))
        before = survivors.filter(
            pl.col("minute_ts").is_between(
                start - timedelta(minutes=self.baseline_minutes), start, closed="left"
            )
        )
        findings = []
        for pool in sorted(pools.to_list()):
            now = during.filter(pl.col("pool") == pool)
            then = before.filter(pl.col("pool") == pool)
            if now.is_empty() or then.is_empty():
                continue
            load, load_before = float(now["held"].mean()), float(then["held"].mean())  # type: ignore[arg-type]
            if load_before <= 0 or load < self.load_ratio * load_before:
                continue
            names = sorted(now["replica"].unique().to_list())
            ratio = load / load_before
            findings.append(
                Finding(
                    kind=self.kind,
                    scope_unit=ScopeUnit.POOL,
                    scope=pool,
                    start=start,
                    end=run["end_ts"],
                    # How far past the threshold the load went: at twice the threshold's rise
                    # the reading is beyond doubt.
                    confidence=round(min(1.0, (ratio - 1) / (2 * (self.load_ratio - 1))), 4),
                    summary=(
                        f"the {len(names)} surviving replicas of pool {pool} carry the load of "
                        f"{unit.value} {run['domain']}'s loss: {load:.1f} requests held per "
                        f"replica against {load_before:.1f} before ({ratio:.1f}x): overloaded "
                        "by the loss, not slow"
                    ),
                    evidence=(
                        Evidence("held_per_replica", load, "requests", baseline=load_before),
                        Evidence("load_ratio", ratio, "ratio", baseline=1.0),
                        Evidence("survivors", float(len(names)), "count"),
                        Evidence("lost_replicas", float(len(lost)), "count"),
                    ),
                    suggestion=(
                        "do not eject the survivors: add capacity or shed load until "
                        f"{run['domain']} is back, and size the pool for losing a whole "
                        f"{unit.value}"
                    ),
                )
            )
        return findings
