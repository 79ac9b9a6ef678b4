"""The detector registry: every fleet-health detector the `health` command runs by default,
in the order their findings are worth reading when they start at the same time."""

from __future__ import annotations

from servewatch.pipeline.affinity_loss import AffinityLossDetector
from servewatch.pipeline.dependency_review import DependencyReview
from servewatch.pipeline.health_finding import Detector
from servewatch.pipeline.kv_pressure import KvPressureDetector
from servewatch.pipeline.rollout_comparison import RolloutComparison
from servewatch.pipeline.slow_replica import SlowReplicaDetector
from servewatch.pipeline.traffic_step import TrafficStepDetector


def default_detectors() -> tuple[Detector, ...]:
    return (
        SlowReplicaDetector(),
        KvPressureDetector(),
        AffinityLossDetector(),
        TrafficStepDetector(),
        RolloutComparison(),
        DependencyReview(),
    )
