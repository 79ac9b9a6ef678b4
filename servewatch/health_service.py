"""`servewatch health`: a store window cut into `HealthInputs`, every default detector run over
it, and the findings in reading order (earliest first; at the same start, the surest).

Shared by the `health` command, the report and the service's evaluation job.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from servewatch.health.detectors import default_detectors, examine
from servewatch.health.finding import DEFAULT_OBJECTIVE_RATIO, Detector, Finding, HealthInputs
from servewatch.pipeline.instants import format_instant
from servewatch.pipeline.window import POINTS_LEAD, Window
from servewatch.slo.alert_state import TableAlertStateStore
from servewatch.slo.burn_rate import evaluation_minute
from servewatch.slo.finding_alerts import DEFAULT_LOOKBACK_S, FindingEvaluation, step_findings
from servewatch.slo.notification import Notifier
from servewatch.slo.spec import SloSpec
from servewatch.slo_service import limits_of, objective_of
from servewatch.store import Store

DEFAULT_VERSION_LABEL = "model"


def _eager(frame: pl.LazyFrame) -> pl.LazyFrame:
    # Detectors read the same frames several times; cut each from the window once.
    return frame.collect().lazy()


def health_window(window: Window) -> tuple[datetime, datetime] | None:
    """[from, to) of the window: open ends default to the stored samples' (and requests')
    span; None when the store holds nothing to examine."""
    spans = [s for s in (window.stored_points, window.stored_requests) if s is not None]
    if not spans:
        return None
    start = window.from_ts or min(s.first for s in spans).replace(second=0, microsecond=0)
    end = window.to_ts or max(s.last for s in spans).replace(second=0, microsecond=0) + timedelta(
        minutes=1
    )
    if end <= start:
        raise ValueError(f"health window ends ({end}) at or before it starts ({start})")
    return start, end


def health_inputs(
    window: Window,
    *,
    start: datetime,
    end: datetime,
    version_label: str = DEFAULT_VERSION_LABEL,
    zone_loss_in_scope: bool = True,
    specs: Sequence[SloSpec] = (),
) -> HealthInputs:
    """What the detectors read over [start, end) of the window (points from a minute
    earlier, so the first minute's counter increments are complete); harm is priced against
    the goodput limits and the strictest traced objective of `specs`."""
    return HealthInputs(
        start=start,
        end=end,
        points=_eager(window.points_between(start - POINTS_LEAD, end)),
        dimensions=_eager(window.dimensions()),
        requests=_eager(window.requests_between(start, end)),
        targets=window.targets.lazy(),
        scrapes=_eager(window.scrapes_between(start, end)),
        version_label=version_label,
        zone_loss_in_scope=zone_loss_in_scope,
        limits=limits_of(specs),
        objective_ratio=objective_of(specs, default=DEFAULT_OBJECTIVE_RATIO),
    )


def ordered(findings: Sequence[Finding]) -> tuple[Finding, ...]:
    """Earliest start first; at the same start the surest, then by kind and scope."""
    return tuple(
        sorted(
            findings,
            key=lambda f: (f.start, -f.confidence, f.kind.value, f.scope_unit.value, f.scope),
        )
    )


def run_detectors(inputs: HealthInputs, detectors: Sequence[Detector]) -> tuple[Finding, ...]:
    return ordered(examine(inputs, detectors))


def health_findings(
    window: Window,
    *,
    version_label: str = DEFAULT_VERSION_LABEL,
    zone_loss_in_scope: bool = True,
    detectors: Sequence[Detector] | None = None,
    specs: Sequence[SloSpec] = (),
) -> tuple[Finding, ...]:
    """Every finding of the detectors (the default set when None) over the window, harm
    priced against `specs` (see `health_inputs`)."""
    bounds = health_window(window)
    if bounds is None:
        return ()
    inputs = health_inputs(
        window,
        start=bounds[0],
        end=bounds[1],
        version_label=version_label,
        zone_loss_in_scope=zone_loss_in_scope,
        specs=specs,
    )
    return run_detectors(inputs, default_detectors() if detectors is None else detectors)


def evaluate_findings(
    store: Store,
    *,
    at: datetime,
    notifier: Notifier | None,
    lookback_s: int = DEFAULT_LOOKBACK_S,
    version_label: str = DEFAULT_VERSION_LABEL,
    specs: Sequence[SloSpec] = (),
) -> FindingEvaluation:
    """One scheduled evaluation of finding alerts: the findings of the `lookback_s` before
    `at` raised or resolved as tickets in the `alerts` table, the notifier told."""
    end = evaluation_minute(at)
    start = end - timedelta(seconds=lookback_s)
    window = store.read_window(from_ts=start, to_ts=end)
    inputs = health_inputs(window, start=start, end=end, version_label=version_label, specs=specs)
    findings = run_detectors(inputs, default_detectors())
    return step_findings(
        findings,
        at=at,
        states=TableAlertStateStore(store),
        notifier=notifier,
        lookback_s=lookback_s,
    )


def finding_json(finding: Finding) -> dict[str, Any]:
    """One finding as `servewatch health --json` prints it; `end` null means ongoing."""
    return {
        "kind": finding.kind.value,
        "scope_unit": finding.scope_unit.value,
        "scope": finding.scope,
        "start": format_instant(finding.start),
        "end": format_instant(finding.end),
        "confidence": finding.confidence,
        "summary": finding.summary,
        "evidence": [
            {"name": e.name, "value": e.value, "unit": e.unit, "baseline": e.baseline}
            for e in finding.evidence
        ],
        "suggestion": finding.suggestion,
        "consequences": [finding_json(c) for c in finding.consequences],
    }
