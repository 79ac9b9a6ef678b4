"""Capacity: per-replica capacity-at-SLO refit, fleet sizing for failure domains, and risk."""
