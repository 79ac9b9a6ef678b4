"""A fleet-health finding: which failure mode the data shows, where, since when, how sure, and
the numbers that say so. Detectors are pure functions of `HealthInputs`; the service layer reads
the store, runs every detector and hands the findings to the CLI, the report and the alerts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Protocol

import polars as pl

from servewatch.pipeline.request_sli import GoodputLimits

# The objective an error budget is counted against when no SLO names one.
DEFAULT_OBJECTIVE_RATIO = 0.99


class FindingKind(Enum):
    """The failure modes the design seeds name, each named for what it is."""

    SLOW_REPLICA = "slow_replica"
    KV_PRESSURE = "kv_pressure"
    AFFINITY_LOSS = "affinity_loss"
    TRAFFIC_STEP = "traffic_step"
    ROLLOUT_REGRESSION = "rollout_regression"
    ERROR_BURST = "error_burst"
    HOST_LOSS = "host_loss"
    ZONE_LOSS = "zone_loss"
    # Replacements that cannot start (an artifact registry, an image pull, a licence server).
    STARTUP_DEPENDENCY = "startup_dependency"
    # Survivors of a loss serving more than they can: a consequence, never its own ticket.
    LOSS_OVERLOAD = "loss_overload"
    GATEWAY_REJECTION = "gateway_rejection"
    AUTOSCALER_LAG = "autoscaler_lag"
    # Configuration that leaves a failure domain unaccounted for (no host or zone, one zone).
    DEPENDENCY = "dependency"


class ScopeUnit(Enum):
    """What a finding is attributed to."""

    REPLICA = "replica"
    HOST = "host"
    ZONE = "zone"
    POOL = "pool"
    VERSION = "version"
    FLEET = "fleet"


@dataclass(frozen=True)
class Evidence:
    """One number behind a finding, with its unit (`s`, `ratio`, `tokens_per_s`, `count`...)
    and, where there is one, what it is compared with (the pool's value, a baseline)."""

    name: str
    value: float
    unit: str
    baseline: float | None = None


@dataclass(frozen=True)
class Finding:
    """`end` is None while the condition is still true at the end of the examined window.
    `confidence` is in [0, 1]: how sure the detector is that the mode is real, not noise."""

    kind: FindingKind
    scope_unit: ScopeUnit
    scope: str
    start: datetime
    end: datetime | None
    confidence: float
    summary: str
    evidence: tuple[Evidence, ...] = ()
    suggestion: str = ""
    # Findings this one caused (a rollout's slow replica, a step's KV pressure, a loss's
    # affinity losses at recovery): one ticket for one cause, the rest its evidence.
    consequences: tuple[Finding, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"confidence must be in [0, 1], got {self.confidence}")
        if self.end is not None and self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")


@dataclass(frozen=True)
class HealthInputs:
    """What the detectors read, as the store holds it, already cut to [start, end).

    - `points`, `dimensions`: scraped samples and `pipeline.metric_sli.series_dimensions`
      output (series with replica, host, zone, pool, model, `le`, signal). A DCGM series
      carries the replica its GPU serves (`pipeline.gpu_attribution`), or a null replica and
      a `gpu_rule` saying why none: a detector reading GPU signals takes
      `pipeline.metric_sli.attributed(dimensions)` and folds a replica's GPUs by each
      signal's aggregation, never a host's GPUs onto each of its replicas.
    - `requests`: traced requests (REQUESTS_SCHEMA); empty when nothing is traced.
    - `targets`, `scrapes`: TARGETS_SCHEMA and SCRAPES_SCHEMA rows.
    - `version_label`: the target label (or `model`) that tells rollout versions apart.
    """

    start: datetime
    end: datetime
    points: pl.LazyFrame
    dimensions: pl.LazyFrame
    requests: pl.LazyFrame
    targets: pl.LazyFrame
    scrapes: pl.LazyFrame
    version_label: str = "model"
    zone_loss_in_scope: bool = field(default=True)
    # What a request must meet to count as good (the SLOs' goodput limits); a failed request
    # is bad whatever the limits. Findings price their harm in requests that missed it.
    limits: GoodputLimits = field(default_factory=GoodputLimits)
    objective_ratio: float = DEFAULT_OBJECTIVE_RATIO


class Detector(Protocol):
    """A plug point: one failure mode, one pure function of the inputs."""

    # Read-only, so frozen dataclasses satisfy it.
    @property
    def kind(self) -> FindingKind: ...

    def detect(self, inputs: HealthInputs) -> list[Finding]: ...
