"""The detector registry: every fleet-health detector the `health` command runs by default,
in the order their findings are worth reading when they start at the same time."""

from __future__ import annotations

from pipeline.affinity_loss import AffinityLossDetector
from pipeline.dependency_review import DependencyReview
from pipeline.health_finding import Detector
from pipeline.kv_pressure import KvPressureDetector
from pipeline.rollout_comparison import RolloutComparison
from pipeline.slow_replica import SlowReplicaDetector
from pipeline.traffic_step import TrafficStepDetector


def default_detectors() -> tuple[Detector, ...]:
    return (
        SlowReplicaDetector(),
        KvPressureDetector(),
        AffinityLossDetector(),
        TrafficStepDetector(),
        RolloutComparison(),
        DependencyReview(),
    )
