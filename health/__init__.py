"""Fleet health: detectors that read the minute frames and name what went wrong, where.

Each detector is a pure function of frames (`HealthInputs`); `default_detectors` lists them all
and `Finding` is their one result type. Nothing here opens the store or the network.
"""

from servewatch.health.detectors import default_detectors
from servewatch.health.finding import Detector, Finding, FindingKind, HealthInputs, ScopeUnit

__all__ = [
    "Detector",
    "Finding",
    "FindingKind",
    "HealthInputs",
    "ScopeUnit",
    "default_detectors",
]
