"""Capacity: per-replica capacity-at-SLO refit, fleet sizing for failure domains, drills, risk."""

from servewatch.capacity.capacity_fit import fit_capacity
from servewatch.capacity.decision_record import DecisionRecord
from servewatch.capacity.drill import DrillSpec
from servewatch.capacity.requirement import Requirement, load_requirement

__all__ = [
    "DecisionRecord",
    "DrillSpec",
    "Requirement",
    "fit_capacity",
    "load_requirement",
]
