"""Box signal: one of the seven boxes of an inference platform (gateway, router, scheduler,
replicas, KV tier, autoscaler, observer), a signal servewatch holds for it, and its state.

A signal's state is a short verdict, `ok`, `degraded` or `no signal` (nothing servewatch
collects shows it), with the number behind it and how that number was computed, thresholds
included; a box is as bad as its worst signal. `BoxFrames` holds the report's frames, already
cut to the report window, that the boxes' signals are computed from (`request_path_boxes`,
`engine_boxes`, `fleet_boxes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import polars as pl

from servewatch.dashboards.panel import TimeDomain
from servewatch.health.finding import Finding, FindingKind

NOT_ENGINES = ("dcgm", "auto")
NAMES_LISTED = 4


class BoxState(Enum):
    OK = "ok"
    DEGRADED = "degraded"
    NO_SIGNAL = "no signal"

    @property
    def rank(self) -> int:
        """Worse states rank higher: a box is as bad as its worst signal."""
        return {BoxState.NO_SIGNAL: 0, BoxState.OK: 1, BoxState.DEGRADED: 2}[self]


class Box(Enum):
    GATEWAY = "gateway"
    ROUTER = "router"
    SCHEDULER = "scheduler"
    REPLICAS = "replicas"
    KV_TIER = "KV tier"
    AUTOSCALER = "autoscaler"
    OBSERVER = "observer"

    @property
    def job(self) -> str:
        return {
            Box.GATEWAY: "auth, quotas, per-tenant rate limits, validation, the streamed reply",
            Box.ROUTER: "which replica: prefix-aware for cache hits, load-aware for balance",
            Box.SCHEDULER: "the engine's batching and admission when the KV pool is full",
            Box.REPLICAS: "model copies on their GPUs, up and healthy",
            Box.KV_TIER: "the paged KV pool on the GPU and any offload beyond it",
            Box.AUTOSCALER: "replica count from queue and KV pressure, cold starts",
            Box.OBSERVER: "servewatch itself: scrapes and ingest",
        }[self]


@dataclass(frozen=True)
class BoxSignal:
    box: Box
    signal: str
    state: BoxState
    value: str
    how: str


@dataclass(frozen=True)
class BoxFrames:
    """The report's frames, each already cut to the window (None: not given)."""

    window: TimeDomain | None = None
    requests: pl.DataFrame | None = None
    request_minutes: pl.DataFrame | None = None
    finish_reasons: pl.DataFrame | None = None
    prefix_cache: pl.DataFrame | None = None
    scheduler_state: pl.DataFrame | None = None
    kv_cache_usage: pl.DataFrame | None = None
    prompt_token_sources: pl.DataFrame | None = None
    scrapes: pl.DataFrame | None = None
    targets: pl.DataFrame | None = None
    findings: Sequence[Finding] | None = None


def box_state(signals: Sequence[BoxSignal]) -> BoxState:
    return max((s.state for s in signals), key=lambda s: s.rank, default=BoxState.NO_SIGNAL)


def has_rows(frame: pl.DataFrame | None) -> bool:
    return frame is not None and not frame.is_empty()


def listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_LISTED])
    more = len(names) - NAMES_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def seconds_text(value: float) -> str:
    """5.2 s, 95 s, 2.5 h, 13.7 d."""
    if value >= 86400:
        return f"{value / 86400:,.1f} d"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    return f"{value:,.0f} s" if value >= 10 else f"{value:.2g} s"


def verdict(degraded: bool) -> BoxState:
    return BoxState.DEGRADED if degraded else BoxState.OK


def findings_of(frames: BoxFrames, kinds: Sequence[FindingKind]) -> list[Finding]:
    return [f for f in frames.findings or () if f.kind in kinds]


def finding_text(findings: Sequence[Finding]) -> str:
    return listed(
        [
            f"{f.kind.value} on {f.scope_unit.value} {f.scope}"
            + (" (ongoing)" if f.end is None else "")
            for f in findings
        ]
    )


def engine_scrapes(frames: BoxFrames) -> pl.DataFrame | None:
    """Scrapes of engine targets (not DCGM exporters), with the replica each target serves.

    A target's kind and replica come from the targets table when given (a failed scrape
    records no kind of page), else from the scrape itself and its target id."""
    scrapes = frames.scrapes
    if not has_rows(scrapes):
        return None
    assert scrapes is not None
    rows = (
        scrapes if "kind" in scrapes.columns else scrapes.with_columns(kind=pl.lit(None, pl.String))
    )
    replica = pl.col("target_id")
    if frames.targets is not None and not frames.targets.is_empty():
        known = frames.targets.select(
            "target_id", target_replica="replica", target_kind="kind"
        ).unique("target_id")
        rows = rows.join(known, on="target_id", how="left").with_columns(
            kind=pl.coalesce("target_kind", "kind")
        )
        replica = pl.coalesce("target_replica", "target_id")
    rows = rows.filter(pl.col("kind").is_null() | ~pl.col("kind").is_in(NOT_ENGINES))
    rows = rows.with_columns(replica=replica)
    return None if rows.is_empty() else rows
