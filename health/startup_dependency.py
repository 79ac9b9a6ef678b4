"""Startup dependencies: replicas that cannot start although their node is up. A replaced host
whose GPU exporter answers again while every replica on it keeps failing its scrapes is waiting
on something outside the node (an artifact registry or image pull, a model store, a licence
server): the node has been replaced, so "check the node" is the wrong advice, and the loss lasts
as long as that dependency is out, not as long as a host takes to replace.

Per host and minute with scrapes: the node answers when any of its non-replica targets (its
DCGM exporter) answered a scrape; the host's replicas are down when every replica target on it
failed every scrape of that minute. A run of at least `min_minutes` such minutes (longer than
a cold start, so a restart that merely takes its cold start is not one) is a blocked start.
Blocked runs of several hosts that overlap in time share a cause: one finding at fleet scope
naming the hosts, rather than one per host. A host without an exporter target cannot tell a
blocked start from a lost node and is left to the host-loss review.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

import polars as pl

from servewatch.health.dependency_review import failed_target_minutes, window_targets
from servewatch.health.episodes import overlapping
from servewatch.health.finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit


def blocked_host_minutes(scrapes: pl.LazyFrame, targets: pl.LazyFrame) -> pl.LazyFrame:
    """Per host and minute: `blocked` when a node target of the host answered and every one of
    its replica targets failed; `replicas` names the host's replica targets."""
    placed = targets.filter(pl.col("host").is_not_null()).select(
        "target_id", "host", is_replica=pl.col("replica").is_not_null(), replica="replica"
    )
    return (
        failed_target_minutes(scrapes)
        .join(placed, on="target_id", how="inner")
        .group_by("host", "minute_ts")
        .agg(
            node_up=(~pl.col("is_replica") & ~pl.col("failed")).any(),
            replicas_failed=(pl.col("is_replica") & pl.col("failed")).sum(),
            replicas_scraped=pl.col("is_replica").sum(),
            replicas=pl.col("replica").drop_nulls().unique().sort(),
        )
        .with_columns(
            blocked=pl.col("node_up")
            & (pl.col("replicas_scraped") > 0)
            & (pl.col("replicas_failed") == pl.col("replicas_scraped"))
        )
        .sort("host", "minute_ts")
    )


def blocked_runs(minutes: pl.LazyFrame, *, min_minutes: int) -> pl.LazyFrame:
    """Runs of consecutive blocked minutes per host: host, start_ts, end_ts (the first minute a
    replica answered; null while none has), blocked_minutes, replicas."""
    runs = minutes.with_columns(
        run=(pl.col("blocked") != pl.col("blocked").shift(1).over("host", order_by="minute_ts"))
        .fill_null(value=True)
        .cum_sum()
        .over("host", order_by="minute_ts"),
        answered=pl.when(~pl.col("blocked")).then(pl.col("minute_ts")),
    ).with_columns(
        next_answer=pl.col("answered").backward_fill().over("host", order_by="minute_ts")
    )
    return (
        runs.filter(pl.col("blocked"))
        .group_by("host", "run")
        .agg(
            start_ts=pl.col("minute_ts").min(),
            last_ts=pl.col("minute_ts").max(),
            end_ts=pl.col("next_answer").last(),
            blocked_minutes=pl.len(),
            replicas=pl.col("replicas")
            .list.explode(keep_nulls=False, empty_as_null=False)
            .unique()
            .sort(),
        )
        .filter(pl.col("blocked_minutes") >= min_minutes)
        .drop("run")
        .sort("start_ts", "host")
    )


@dataclass(frozen=True)
class StartupDependencyReview:
    """`min_minutes` [5]: blocked minutes that make a blocked start, longer than a cold start."""

    kind = FindingKind.STARTUP_DEPENDENCY  # a class attribute, not a field: it never varies
    min_minutes: int = 5

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        targets = window_targets(inputs.targets, start=inputs.start, end=inputs.end)
        scrapes = inputs.scrapes.filter(
            (pl.col("ts") >= inputs.start) & (pl.col("ts") < inputs.end)
        )
        runs = blocked_runs(
            blocked_host_minutes(scrapes, targets), min_minutes=self.min_minutes
        ).collect()
        groups = overlapping(
            runs.to_dicts(), start=itemgetter("start_ts"), end=itemgetter("end_ts")
        )
        return [self._finding(group) for group in groups]

    def _finding(self, runs: list[dict[str, Any]]) -> Finding:
        hosts = sorted({run["host"] for run in runs})
        replicas = sorted({r for run in runs for r in run["replicas"]})
        start: datetime = min(run["start_ts"] for run in runs)
        ends = [run["end_ts"] for run in runs]
        end = None if any(e is None for e in ends) else max(ends)
        longest = max(run["blocked_minutes"] for run in runs)
        where = (
            f"host {hosts[0]}" if len(hosts) == 1 else f"{len(hosts)} hosts ({', '.join(hosts)})"
        )
        until = "and still cannot" if end is None else f"until {end:%H:%M}"
        shared = (
            ""
            if len(hosts) == 1
            else ": several nodes blocked at once point at one shared dependency"
        )
        return Finding(
            kind=self.kind,
            scope_unit=ScopeUnit.HOST if len(hosts) == 1 else ScopeUnit.FLEET,
            scope=hosts[0] if len(hosts) == 1 else "fleet",
            start=start,
            end=end,
            # Each further minute of a node up with its replicas down makes a slow cold start
            # a less likely reading; past min_minutes it is near certain.
            confidence=round(min(0.99, 1.0 - 0.5 ** (longest - self.min_minutes + 1)), 4),
            summary=(
                f"{where} up again from {start:%H:%M} but its replicas ({', '.join(replicas)}) "
                f"could not start for {longest} minute(s), {until}{shared}: a startup "
                "dependency (artifact registry, image pull, model store), not the node"
            ),
            evidence=(
                Evidence("hosts", float(len(hosts)), "count"),
                Evidence("replicas", float(len(replicas)), "count"),
                Evidence("blocked_minutes", float(longest), "count"),
            ),
            suggestion=(
                "check what replicas pull at start (the artifact or image registry, the model "
                "store) and its credentials; the nodes answer, so replacing them again will not "
                "help; keep a cached image or model copy on the nodes to start without it"
            ),
        )
