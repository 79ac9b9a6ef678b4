"""Cost: what GPU capacity costs per month, so the failure reserve carries a price.

The reserve is the capacity bought beyond what meets healthy demand; seed 000: "That reserve has
a cost. State it rather than hiding it in an unexplained multiplier."
"""

from __future__ import annotations

from dataclasses import dataclass

from capacity.figure import Figure, assumed

HOURS_PER_MONTH = 8760 / 12


def default_hours_per_month() -> Figure:
    return assumed(HOURS_PER_MONTH, "h/month", "8,760 hours a year / 12 months")


@dataclass(frozen=True)
class CostSpec:
    usd_per_gpu_hour: Figure | None
    hours_per_month: Figure


def usd_per_month(
    *, replicas: int, gpus_per_replica: int, usd_per_gpu_hour: float, hours_per_month: float
) -> float:
    return replicas * gpus_per_replica * usd_per_gpu_hour * hours_per_month
