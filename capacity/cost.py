"""Cost: what GPU capacity costs, so the failure reserve and the service carry a price.

The reserve is the capacity bought beyond what meets healthy demand; seed 000: "That reserve has
a cost. State it rather than hiding it in an unexplained multiplier." The lines seed 003 states
follow from the fleet's GPU-hours: $/hour, $/month, $ per million output tokens at the demand,
and $ per user-month of peak-sized capacity when users are stated (its 360 H100s at $2.50/h:
$900/h, ~$650k/month, ~$65 per user-month for 10,000 users).
"""

from __future__ import annotations

from dataclasses import dataclass

from servewatch.capacity.figure import Figure, assumed, derived, fmt

HOURS_PER_MONTH = 8760 / 12


def default_hours_per_month() -> Figure:
    return assumed(HOURS_PER_MONTH, "h/month", "8,760 hours a year / 12 months")


@dataclass(frozen=True)
class CostSpec:
    usd_per_gpu_hour: Figure | None
    hours_per_month: Figure


def usd_per_month(
    *, replicas: float, gpus_per_replica: int, usd_per_gpu_hour: float, hours_per_month: float
) -> float:
    return replicas * gpus_per_replica * usd_per_gpu_hour * hours_per_month


@dataclass(frozen=True)
class CostLines:
    """What the recommended fleet costs, each line with the arithmetic behind it."""

    usd_per_hour: Figure
    usd_per_month: Figure
    usd_per_million_output_tokens: Figure | None
    usd_per_user_month: Figure | None
    # The month's cost if the fleet followed the observed daily shape (seed 003's autoscaled
    # average), and that per user.
    autoscaled_usd_per_month: Figure | None = None
    autoscaled_usd_per_user_month: Figure | None = None


@dataclass(frozen=True)
class AutoscaledFleet:
    """The replicas a fleet would run, hour by hour of the observed day, if it kept to what
    each hour's mean demand needs under the same failure promise."""

    mean_replicas: float
    hours: int


def cost_lines(
    *,
    replicas: int,
    gpus_per_replica: int,
    usd_per_gpu_hour: Figure,
    hours_per_month: Figure,
    output_tokens_per_s: Figure | None = None,
    users: Figure | None = None,
    autoscaled: AutoscaledFleet | None = None,
) -> CostLines:
    """The fleet's cost lines. Per million output tokens is at the demand's token rate as if it
    held all month (peak-sized: the cost of a token served at peak); per user-month divides the
    peak-sized month by the users it serves."""
    hourly = derived(
        replicas * gpus_per_replica * usd_per_gpu_hour.value,
        "usd/hour",
        f"{replicas} replicas x {gpus_per_replica} GPUs x {usd_per_gpu_hour.text()}",
    )
    monthly = derived(
        hourly.value * hours_per_month.value,
        "usd/month",
        f"{usd_text(hourly.value)}/hour x {hours_per_month.text()}",
    )
    per_million = None
    if output_tokens_per_s is not None and output_tokens_per_s.value > 0:
        millions_per_hour = output_tokens_per_s.value * 3600 / 1e6
        per_million = derived(
            hourly.value / millions_per_hour,
            "usd/M output tokens",
            f"{usd_text(hourly.value)}/hour / ({fmt(output_tokens_per_s.value)} output tokens/s x "
            "3,600 s), the demand's rate held all hour",
        )
    scaled = None
    if autoscaled is not None:
        scaled = derived(
            usd_per_month(
                replicas=autoscaled.mean_replicas,
                gpus_per_replica=gpus_per_replica,
                usd_per_gpu_hour=usd_per_gpu_hour.value,
                hours_per_month=hours_per_month.value,
            ),
            "usd/month",
            f"{fmt(autoscaled.mean_replicas)} replicas on average over {autoscaled.hours} "
            f"observed hours x {gpus_per_replica} GPUs x {usd_per_gpu_hour.text()} x "
            f"{hours_per_month.text()}",
        )
    return CostLines(
        usd_per_hour=hourly,
        usd_per_month=monthly,
        usd_per_million_output_tokens=per_million,
        usd_per_user_month=_per_user(monthly, users, how="peak-sized capacity"),
        autoscaled_usd_per_month=scaled,
        autoscaled_usd_per_user_month=_per_user(scaled, users, how="autoscaled"),
    )


def _per_user(month: Figure | None, users: Figure | None, *, how: str) -> Figure | None:
    """A month's cost per stated user, or None without a month or users."""
    if month is None or users is None or users.value <= 0:
        return None
    return derived(
        month.value / users.value,
        "usd/user-month",
        f"{usd_text(month.value)}/month / {fmt(users.value)} users, {how}",
    )


def usd_text(value: float) -> str:
    """Dollars as a worksheet writes them: cents below $100 ($5.01), whole dollars above."""
    if value == 0:
        return "$0"
    return f"${value:,.2f}" if abs(value) < 100 else f"${value:,.0f}"
