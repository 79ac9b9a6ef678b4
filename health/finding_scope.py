"""A finding's scope as requests and replicas: which traced requests a replica, host, zone,
pool, version or the fleet served, and which replicas lie inside a host, zone or pool. Harm
pricing counts a finding's requests with it; root-cause grouping asks whether one finding's
replica lies inside another's domain.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from servewatch.health.finding import Finding, HealthInputs, ScopeUnit
from servewatch.health.rollout_comparison import series_versions

_PLACEMENT = ("host", "zone", "pool")


@dataclass(frozen=True)
class ScopeIndex:
    """Each replica's host, zone and pool (from the targets), the replicas that ran each
    version (from their series' labels), and the version label's column."""

    placement: dict[str, dict[str, str | None]]
    versions: dict[str, frozenset[str]]
    version_label: str

    @classmethod
    def of(cls, inputs: HealthInputs) -> ScopeIndex:
        rows = (
            inputs.targets.filter(pl.col("replica").is_not_null())
            .group_by("replica")
            .agg(pl.col(c).drop_nulls().first() for c in _PLACEMENT)
            .collect()
        )
        placement = {
            row["replica"]: {c: row[c] for c in _PLACEMENT} for row in rows.iter_rows(named=True)
        }
        ran = (
            series_versions(inputs.dimensions, version_label=inputs.version_label)
            .filter(pl.col("replica").is_not_null() & pl.col("version").is_not_null())
            .group_by("version")
            .agg(pl.col("replica").unique())
            .collect()
        )
        versions = {row["version"]: frozenset(row["replica"]) for row in ran.iter_rows(named=True)}
        return cls(placement=placement, versions=versions, version_label=inputs.version_label)

    def replicas(self, unit: ScopeUnit, scope: str) -> frozenset[str] | None:
        """The replicas inside a replica, host, zone or pool scope, or that ran a version at
        some time; None for the fleet."""
        if unit is ScopeUnit.REPLICA:
            return frozenset((scope,))
        if unit is ScopeUnit.VERSION:
            return self.versions.get(scope, frozenset())
        if unit.value in _PLACEMENT:
            return frozenset(r for r, p in self.placement.items() if p[unit.value] == scope)
        return None

    def pool_of(self, replica: str) -> str | None:
        return self.placement.get(replica, {}).get("pool")

    def contains(self, outer: Finding, inner: Finding) -> bool:
        """Whether `inner`'s replicas all lie inside `outer`'s scope (the fleet holds all)."""
        if outer.scope_unit is ScopeUnit.FLEET:
            return True
        mine, theirs = (
            self.replicas(outer.scope_unit, outer.scope),
            self.replicas(inner.scope_unit, inner.scope),
        )
        return mine is not None and theirs is not None and bool(theirs) and theirs <= mine

    def same_pool(self, a: Finding, b: Finding) -> bool:
        """Whether both findings' replicas share one pool (a pool scope is its own pool)."""

        def pools(f: Finding) -> set[str | None]:
            if f.scope_unit is ScopeUnit.POOL:
                return {f.scope}
            return {self.pool_of(r) for r in self.replicas(f.scope_unit, f.scope) or ()}

        mine, theirs = pools(a), pools(b)
        return bool(mine) and bool(theirs) and mine == theirs

    def requests_of(self, requests: pl.LazyFrame, finding: Finding) -> pl.LazyFrame:
        """The traced requests the finding's scope served (all of them for the fleet)."""
        unit = finding.scope_unit
        if unit is ScopeUnit.FLEET:
            return requests
        if unit is ScopeUnit.VERSION:
            if self.version_label not in requests.collect_schema().names():
                return requests.clear()
            return requests.filter(pl.col(self.version_label).cast(pl.String) == finding.scope)
        return requests.filter(pl.col(unit.value) == finding.scope)
