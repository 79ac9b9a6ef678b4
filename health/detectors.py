"""The detector registry: every fleet-health detector the `health` command runs by default,
in the order their findings are worth reading when they start at the same time."""

from __future__ import annotations

from servewatch.health.affinity_loss import AffinityLossDetector
from servewatch.health.dependency_review import DependencyReview
from servewatch.health.finding import Detector
from servewatch.health.kv_pressure import KvPressureDetector
from servewatch.health.rollout_comparison import RolloutComparison
from servewatch.health.slow_replica import SlowReplicaDetector
from servewatch.health.traffic_step import TrafficStepDetector


def default_detectors() -> tuple[Detector, ...]:
    return (
        SlowReplicaDetector(),
        KvPressureDetector(),
        AffinityLossDetector(),
        TrafficStepDetector(),
        RolloutComparison(),
        DependencyReview(),
    )
