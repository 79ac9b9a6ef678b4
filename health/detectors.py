"""The detector registry: every fleet-health detector the `health` command runs by default,
in the order their findings are worth reading when they start at the same time, and the
examination that runs them: each finding priced in SLO harm, then grouped under its cause."""

from __future__ import annotations

from collections.abc import Sequence

from servewatch.health.affinity_loss import AffinityLossDetector
from servewatch.health.dependency_review import DependencyReview
from servewatch.health.error_burst import ErrorBurstDetector
from servewatch.health.finding import Detector, Finding, HealthInputs
from servewatch.health.finding_scope import ScopeIndex
from servewatch.health.gateway_rejection import GatewayRejectionDetector
from servewatch.health.harm import priced
from servewatch.health.kv_pressure import KvPressureDetector
from servewatch.health.loss_overload import LossOverloadDetector
from servewatch.health.rollout_comparison import RolloutComparison
from servewatch.health.root_cause import grouped
from servewatch.health.slow_replica import SlowReplicaDetector
from servewatch.health.startup_dependency import StartupDependencyReview
from servewatch.health.traffic_step import TrafficStepDetector


def default_detectors() -> tuple[Detector, ...]:
    return (
        SlowReplicaDetector(),
        ErrorBurstDetector(),
        KvPressureDetector(),
        AffinityLossDetector(),
        TrafficStepDetector(),
        GatewayRejectionDetector(),
        RolloutComparison(),
        DependencyReview(),
        LossOverloadDetector(),
        StartupDependencyReview(),
    )


def examine(inputs: HealthInputs, detectors: Sequence[Detector] | None = None) -> list[Finding]:
    """Every finding of the detectors (the default set when None), each priced in the harm it
    did, those one cause explains folded into that cause."""
    found = [
        f
        for d in (default_detectors() if detectors is None else detectors)
        for f in d.detect(inputs)
    ]
    index = ScopeIndex.of(inputs)
    return grouped(priced(found, inputs, index=index), index, window_end=inputs.end)
