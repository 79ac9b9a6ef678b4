"""Dependency review: what the targets and their scrape history say about shared failure
domains. Replicas without a host or zone cannot be placed in a failure table; a pool whose
every replica sits in one zone has no surviving capacity when that zone is lost (when zone loss
is in scope); and every target of one host failing its scrapes in the same minutes is one host
loss, not several replica faults, so it is reported once, at host scope, with its start and end.
Every target of a zone failing together is likewise one zone loss, reported at zone scope in
place of its hosts' losses.

A minute fails for a target when all of its scrapes in that minute failed. A loss run is a
stretch of minutes in which every target of the host or zone (its replicas and, when scraped,
its GPU exporters) failed; a minute in which any of them answered ends it. A host with a single
target is left out: its failure cannot be told apart from the replica's own; so is a zone on a
single host, whose loss is that host's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import polars as pl

from servewatch.health.finding import (
    Evidence,
    Finding,
    FindingKind,
    HealthInputs,
    ScopeUnit,
)

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


def failed_target_minutes(scrapes: pl.LazyFrame) -> pl.LazyFrame:
    """Per target and minute with scrapes: `failed` when every scrape of that minute failed."""
    return (
        scrapes.with_columns(minute_ts=pl.col("ts").dt.truncate("1m"))
        .group_by("target_id", "minute_ts")
        .agg((~pl.col("ok")).all().alias("failed"))
    )


def domain_minutes(
    target_minutes: pl.LazyFrame, targets: pl.LazyFrame, *, domain: ScopeUnit
) -> pl.LazyFrame:
    """Per failure domain (column `domain`: a host or a zone name) and minute with scrapes, from
    `failed_target_minutes`: how many of its targets were scraped and how many failed every
    scrape; `domain_targets` is how many targets it has in all and `domain_hosts` how many
    hosts they sit on."""
    placed = targets.filter(~_blank(domain.value)).select(
        "target_id", pl.col(domain.value).alias("domain"), "host"
    )
    sizes = placed.group_by("domain").agg(
        pl.len().alias("domain_targets"),
        pl.col("host").drop_nulls().n_unique().alias("domain_hosts"),
    )
    return (
        target_minutes.join(placed.drop("host"), on="target_id", how="inner")
        .group_by("domain", "minute_ts")
        .agg(
            pl.len().alias("scraped_targets"),
            pl.col("failed").sum().alias("failed_targets"),
        )
        .join(sizes, on="domain", how="left")
        .sort("domain", "minute_ts")
    )


def loss_runs(minutes: pl.LazyFrame, *, min_targets: int, min_hosts: int = 1) -> pl.LazyFrame:
    """Runs of minutes in which every target of a domain failed: domain, start_ts, last_ts (the
    run's last failed minute), end_ts (the first minute after it in which a target answered;
    null while none has), failed_minutes (wall-clock minutes from start_ts to end_ts, or through
    last_ts while ongoing), scraped_minutes (the minutes among them that had scrapes, all
    failed: fewer than failed_minutes when scrapes are more than a minute apart), targets,
    hosts."""
    lost = (pl.col("failed_targets") == pl.col("domain_targets")) & (
        pl.col("scraped_targets") == pl.col("domain_targets")
    )
    flagged = (
        minutes.filter(
            (pl.col("domain_targets") >= min_targets) & (pl.col("domain_hosts") >= min_hosts)
        )
        .with_columns(lost=lost)
        .with_columns(
            run=(pl.col("lost") != pl.col("lost").shift(1).over("domain", order_by="minute_ts"))
            .fill_null(value=True)
            .cum_sum()
            .over("domain", order_by="minute_ts"),
            answered=pl.when(~pl.col("lost")).then(pl.col("minute_ts")),
        )
        .with_columns(
            next_answer=pl.col("answered").backward_fill().over("domain", order_by="minute_ts")
        )
    )
    return (
        flagged.filter(pl.col("lost"))
        .group_by("domain", "run")
        .agg(
            pl.col("minute_ts").min().alias("start_ts"),
            pl.col("minute_ts").max().alias("last_ts"),
            pl.col("next_answer").last().alias("end_ts"),
            pl.len().alias("scraped_minutes"),
            pl.col("domain_targets").first().alias("targets"),
            pl.col("domain_hosts").first().alias("hosts"),
        )
        .drop("run")
        .with_columns(
            failed_minutes=(
                pl.coalesce("end_ts", pl.col("last_ts") + pl.duration(minutes=1))
                - pl.col("start_ts")
            ).dt.total_minutes()
        )
        .sort("domain", "start_ts")
    )


def host_runs_outside_zone_runs(
    host_runs: pl.LazyFrame, zone_runs: pl.LazyFrame, targets: pl.LazyFrame
) -> pl.LazyFrame:
    """Host-loss runs not inside a loss run of the host's zone: a host lost with its whole zone
    is part of that zone's finding, not a finding of its own."""
    zones = (
        targets.filter(~_blank("host") & ~_blank("zone"))
        .group_by("host")
        .agg(pl.col("zone").first())
        .rename({"host": "domain"})
    )
    inside = (
        host_runs.join(zones, on="domain", how="inner")
        .join(
            zone_runs.select(
                pl.col("domain").alias("zone"),
                pl.col("start_ts").alias("zone_start_ts"),
                pl.col("last_ts").alias("zone_last_ts"),
            ),
            on="zone",
            how="inner",
        )
        .filter(
            (pl.col("start_ts") >= pl.col("zone_start_ts"))
            & (pl.col("last_ts") <= pl.col("zone_last_ts"))
        )
        .select("domain", "start_ts")
    )
    return host_runs.join(inside, on=["domain", "start_ts"], how="anti").sort("domain", "start_ts")


def domain_losses(
    scrapes: pl.LazyFrame, targets: pl.LazyFrame, *, min_host_targets: int
) -> tuple[tuple[ScopeUnit, pl.DataFrame], tuple[ScopeUnit, pl.DataFrame]]:
    """The zone losses and the host losses outside them (`loss_runs` columns, `domain` the
    zone or host): a host lost with its whole zone is the zone's loss, and a zone on one host
    is that host's."""
    target_minutes = failed_target_minutes(scrapes).collect().lazy()
    host_runs = loss_runs(
        domain_minutes(target_minutes, targets, domain=ScopeUnit.HOST),
        min_targets=min_host_targets,
    )
    zone_runs = loss_runs(
        domain_minutes(target_minutes, targets, domain=ScopeUnit.ZONE),
        min_targets=min_host_targets,
        min_hosts=2,
    ).collect()
    host_runs = host_runs_outside_zone_runs(host_runs, zone_runs.lazy(), targets)
    return (ScopeUnit.ZONE, zone_runs), (ScopeUnit.HOST, host_runs.collect())


def replicas_by(targets: pl.LazyFrame, unit: ScopeUnit) -> dict[str, list[str]]:
    """The replicas on each host or in each zone, sorted."""
    rows = (
        targets.filter(pl.col("replica").is_not_null() & ~_blank(unit.value))
        .group_by(unit.value)
        .agg(pl.col("replica").unique().sort())
        .collect()
    )
    return {row[unit.value]: row["replica"] for row in rows.iter_rows(named=True)}


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
        findings += self._losses(scrapes, targets)
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

    def _losses(self, scrapes: pl.LazyFrame, targets: pl.LazyFrame) -> list[Finding]:
        findings = []
        for unit, runs in domain_losses(scrapes, targets, min_host_targets=self.min_host_targets):
            replicas = replicas_by(targets, unit)
            findings += [
                self._loss(unit, row, replicas.get(row["domain"], []))
                for row in runs.iter_rows(named=True)
            ]
        return findings

    def _loss(self, unit: ScopeUnit, row: dict[str, Any], names: list[str]) -> Finding:
        name, targets_n, failed = row["domain"], row["targets"], row["failed_minutes"]
        scraped = row["scraped_minutes"]
        # Each further target-minute failing in lockstep halves the odds of coincidence; only
        # minutes with scrapes are observations.
        confidence = min(0.99, 1.0 - 0.5 ** ((targets_n - 1) * scraped))
        observed = (
            ""
            if scraped == failed
            else f", {scraped} of those minutes scraped, every scrape failing"
        )
        until = "ongoing" if row["end_ts"] is None else f"until {row['end_ts']:%H:%M}"
        where = f"{unit.value} {name}"
        if unit is ScopeUnit.ZONE:
            where += f" ({row['hosts']} hosts)"
        return Finding(
            kind=FindingKind.ZONE_LOSS if unit is ScopeUnit.ZONE else FindingKind.HOST_LOSS,
            scope_unit=unit,
            scope=name,
            start=row["start_ts"],
            end=row["end_ts"],
            confidence=confidence,
            summary=(
                f"{where} lost: all {targets_n} of its targets failed their scrapes "
                f"together for {failed} minute(s) from {row['start_ts']:%H:%M} {until}"
                f"{observed} ({unit.value} loss, not {len(names)} replica faults: "
                f"{', '.join(names) or 'no replicas'})"
            ),
            evidence=(
                Evidence("targets", float(targets_n), "count"),
                *(
                    [Evidence("hosts", float(row["hosts"]), "count")]
                    if unit is ScopeUnit.ZONE
                    else []
                ),
                Evidence("replicas", float(len(names)), "count"),
                Evidence("failed_minutes", float(failed), "count"),
                Evidence("failed_scraped_minutes", float(scraped), "count"),
            ),
            suggestion=(
                f"treat it as a {unit.value} failure: check "
                + ("the node" if unit is ScopeUnit.HOST else "the zone's network and power")
                + f", and size for losing a whole {unit.value}, since its replicas fail together"
            ),
        )
