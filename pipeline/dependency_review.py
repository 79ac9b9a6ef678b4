"""Dependency review: what the targets and their scrape history say about shared failure
domains. Replicas without a host or zone cannot be placed in a failure table; a pool whose
every replica sits in one zone has no surviving capacity when that zone is lost (when zone loss
is in scope); and every target of one host failing its scrapes in the same minutes is one host
loss, not several replica faults, so it is reported once, at host scope, with its start and end.

A minute fails for a target when all of its scrapes in that minute failed. A host-loss run is a
stretch of minutes in which every target of the host (its replicas and, when scraped, its GPU
exporter) failed; a minute in which any of them answered ends it. A host with a single target
is left out: its failure cannot be told apart from the replica's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import polars as pl

from pipeline.health_finding import Evidence, Finding, FindingKind, HealthInputs, ScopeUnit

NO_POOL = "(no pool)"


def _blank(column: str) -> pl.Expr:
    return pl.col(column).is_null() | (pl.col(column).str.strip_chars() == "")


def window_targets(targets: pl.LazyFrame, *, start: datetime, end: datetime) -> pl.LazyFrame:
    """Targets seen in [start, end) (a target never seen counts as present)."""
    return targets.filter(
        (pl.col("first_seen_ts").is_null() | (pl.col("first_seen_ts") < end))
        & (pl.col("last_seen_ts").is_null() | (pl.col("last_seen_ts") >= start))
    )


def unplaced_replicas(targets: pl.LazyFrame) -> pl.LazyFrame:
    """Replica targets missing a host or a zone: replica, target_id, missing (e.g. `zone`,
    `host and zone`), first_seen_ts."""
    replicas = targets.filter(pl.col("replica").is_not_null())
    missing = (
        pl.when(_blank("host") & _blank("zone"))
        .then(pl.lit("host and zone"))
        .when(_blank("host"))
        .then(pl.lit("host"))
        .when(_blank("zone"))
        .then(pl.lit("zone"))
    )
    return (
        replicas.with_columns(missing=missing)
        .filter(pl.col("missing").is_not_null())
        .select("replica", "target_id", "missing", "first_seen_ts")
        .sort("replica")
    )


def single_zone_pools(targets: pl.LazyFrame) -> pl.LazyFrame:
    """Pools whose placed replicas all sit in one zone: pool, zone, replicas, hosts, gpus."""
    placed = targets.filter(pl.col("replica").is_not_null() & ~_blank("zone"))
    return (
        placed.with_columns(pool=pl.col("pool").fill_null(NO_POOL))
        .group_by("pool")
        .agg(
            pl.col("zone").n_unique().alias("zones"),
            pl.col("zone").first(),
            pl.col("replica").n_unique().alias("replicas"),
            pl.col("host").drop_nulls().n_unique().alias("hosts"),
            pl.col("gpus").fill_null(1).sum().alias("gpus"),
        )
        .filter(pl.col("zones") == 1)
        .select("pool", "zone", "replicas", "hosts", "gpus")
        .sort("pool")
    )


def host_minutes(scrapes: pl.LazyFrame, targets: pl.LazyFrame) -> pl.LazyFrame:
    """Per host and minute with scrapes: how many of the host's targets were scraped and how
    many failed every scrape; `host_targets` is how many targets the host has in all."""
    hosted = targets.filter(~_blank("host")).select("target_id", "host")
    sizes = hosted.group_by("host").agg(pl.len().alias("host_targets"))
    per_target = (
        scrapes.join(hosted, on="target_id", how="inner")
        .with_columns(minute_ts=pl.col("ts").dt.truncate("1m"))
        .group_by("host", "target_id", "minute_ts")
        .agg((~pl.col("ok")).all().alias("failed"))
    )
    return (
        per_target.group_by("host", "minute_ts")
        .agg(
            pl.len().alias("scraped_targets"),
            pl.col("failed").sum().alias("failed_targets"),
        )
        .join(sizes, on="host", how="left")
        .sort("host", "minute_ts")
    )


def host_loss_runs(minutes: pl.LazyFrame, *, min_targets: int) -> pl.LazyFrame:
    """Runs of minutes in which every target of a host failed: host, start_ts, last_ts (the
    run's last failed minute), end_ts (the first minute after it in which a target answered;
    null while none has), failed_minutes, targets."""
    lost = (pl.col("failed_targets") == pl.col("host_targets")) & (
        pl.col("scraped_targets") == pl.col("host_targets")
    )
    flagged = (
        minutes.filter(pl.col("host_targets") >= min_targets)
        .with_columns(lost=lost)
        .with_columns(
            run=(pl.col("lost") != pl.col("lost").shift(1).over("host", order_by="minute_ts"))
            .fill_null(value=True)
            .cum_sum()
            .over("host", order_by="minute_ts"),
            answered=pl.when(~pl.col("lost")).then(pl.col("minute_ts")),
        )
        .with_columns(
            next_answer=pl.col("answered").backward_fill().over("host", order_by="minute_ts")
        )
    )
    return (
        flagged.filter(pl.col("lost"))
        .group_by("host", "run")
        .agg(
            pl.col("minute_ts").min().alias("start_ts"),
            pl.col("minute_ts").max().alias("last_ts"),
            pl.col("next_answer").last().alias("end_ts"),
            pl.len().alias("failed_minutes"),
            pl.col("host_targets").first().alias("targets"),
        )
        .drop("run")
        .sort("host", "start_ts")
    )


@dataclass(frozen=True)
class DependencyReview:
    """The detector. `min_host_targets`: a host needs this many targets for its loss to be
    told apart from a replica's fault."""

    kind = FindingKind.DEPENDENCY  # a class attribute, not a field: it never varies
    min_host_targets: int = 2

    def detect(self, inputs: HealthInputs) -> list[Finding]:
        targets = window_targets(inputs.targets, start=inputs.start, end=inputs.end)
        scrapes = inputs.scrapes.filter(
            (pl.col("ts") >= inputs.start) & (pl.col("ts") < inputs.end)
        )
        findings = self._unplaced(targets, start=inputs.start)
        if inputs.zone_loss_in_scope:
            findings += self._single_zone(targets, start=inputs.start)
        findings += self._host_losses(scrapes, targets)
        return findings

    def _unplaced(self, targets: pl.LazyFrame, *, start: datetime) -> list[Finding]:
        rows = unplaced_replicas(targets).collect()
        return [
            Finding(
                kind=self.kind,
                scope_unit=ScopeUnit.REPLICA,
                scope=row["replica"],
                start=max(start, row["first_seen_ts"] or start),
                end=None,
                confidence=1.0,
                summary=(
                    f"replica {row['replica']} (target {row['target_id']}) has no "
                    f"{row['missing']}: it cannot be placed in a failure domain, so host or "
                    "zone loss cannot be judged for it"
                ),
                evidence=(Evidence(f"missing_{row['missing'].replace(' ', '_')}", 1.0, "count"),),
                suggestion=(
                    "label the target with its host and zone (servewatch.toml targets or "
                    "file_sd labels)"
                ),
            )
            for row in rows.iter_rows(named=True)
        ]

    def _single_zone(self, targets: pl.LazyFrame, *, start: datetime) -> list[Finding]:
        rows = single_zone_pools(targets).collect()
        return [
            Finding(
                kind=self.kind,
                scope_unit=ScopeUnit.ZONE,
                scope=row["zone"],
                start=start,
                end=None,
                confidence=1.0,
                summary=(
                    f"all {row['replicas']} replicas of pool {row['pool']} are in zone "
                    f"{row['zone']} ({row['hosts']} hosts): losing that zone leaves the pool "
                    "no capacity, and more hosts in the same zone do not change that"
                ),
                evidence=(
                    Evidence("replicas", float(row["replicas"]), "count"),
                    Evidence("hosts", float(row["hosts"]), "count"),
                    Evidence("gpus", float(row["gpus"]), "count"),
                    Evidence("zones", 1.0, "count"),
                ),
                suggestion=(
                    f"place capacity for pool {row['pool']} in another zone, sized to carry "
                    "the demand without this one (servewatch recommend with zone loss)"
                ),
            )
            for row in rows.iter_rows(named=True)
        ]

    def _host_losses(self, scrapes: pl.LazyFrame, targets: pl.LazyFrame) -> list[Finding]:
        minutes = host_minutes(scrapes, targets)
        runs = host_loss_runs(minutes, min_targets=self.min_host_targets).collect()
        replicas = (
            targets.filter(pl.col("replica").is_not_null() & ~_blank("host"))
            .group_by("host")
            .agg(pl.col("replica").unique().sort())
            .collect()
        )
        on_host = {row["host"]: row["replica"] for row in replicas.iter_rows(named=True)}
        findings = []
        for row in runs.iter_rows(named=True):
            host, targets_n, failed = row["host"], row["targets"], row["failed_minutes"]
            names = on_host.get(host, [])
            # Each further target-minute failing in lockstep halves the odds of coincidence.
            confidence = min(0.99, 1.0 - 0.5 ** ((targets_n - 1) * failed))
            until = "ongoing" if row["end_ts"] is None else f"until {row['end_ts']:%H:%M}"
            findings.append(
                Finding(
                    kind=self.kind,
                    scope_unit=ScopeUnit.HOST,
                    scope=host,
                    start=row["start_ts"],
                    end=row["end_ts"],
                    confidence=confidence,
                    summary=(
                        f"host {host} lost: all {targets_n} of its targets failed their scrapes "
                        f"together for {failed} minute(s) from {row['start_ts']:%H:%M} {until} "
                        f"(host loss, not {len(names)} replica faults: "
                        f"{', '.join(names) or 'no replicas'})"
                    ),
                    evidence=(
                        Evidence("targets", float(targets_n), "count"),
                        Evidence("replicas", float(len(names)), "count"),
                        Evidence("failed_minutes", float(failed), "count"),
                    ),
                    suggestion=(
                        "treat it as a host failure: check the node, and size for losing a "
                        "whole host, since its replicas fail together"
                    ),
                )
            )
        return findings
