"""Worksheet: `servewatch size`, the sizing arithmetic from stated assumptions, without data.

Takes what seed 000's worksheet takes (demand, one replica's capacity, replicas per host,
failure unit, zones, headroom, GPU price) and produces the same decision record as a
measured recommendation: chain, failure table, cost, reserve and risk. The options are read
through the requirement loader, so they are validated exactly as a requirement file is, and
errors name the command-line option.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from servewatch.capacity.decision_record import DecisionRecord
from servewatch.capacity.recommendation import recommend
from servewatch.capacity.requirement import RequirementError, load_requirement, parse_requirement

WHERE = "size options"

# Requirement field path -> the `servewatch size` option that sets it.
OPTIONS: dict[str, str] = {
    "failure_unit": "--failure-unit",
    "headroom_ratio": "--headroom",
    "demand.req_per_min": "--demand-req-per-min",
    "replica.capacity_req_per_min": "--capacity-req-per-min",
    "replica.gpus": "--gpus-per-replica",
    "placement.replicas_per_host": "--replicas-per-host",
    "placement.zones": "--zones",
    "placement.candidate_hosts": "--hosts",
    "recovery.interval_s": "--recovery-interval-s",
    "recovery.backlog_requests": "--backlog-requests",
    "recovery.replacement_startup_s": "--replacement-startup-s",
    "recovery.startup_dependencies": "--startup-dependency",
    "cost.usd_per_gpu_hour": "--usd-per-gpu-hour",
    "cost.hours_per_month": "--hours-per-month",
}


def zone_names(zones: int | Sequence[str]) -> list[str]:
    """Zone names from a count (zone-1, zone-2, ...) or as given."""
    if isinstance(zones, int):
        if zones < 1:
            raise RequirementError(f"{WHERE}: --zones: must be 1 or more, got {zones}")
        return [f"zone-{index}" for index in range(1, zones + 1)]
    return list(zones)


def size(
    *,
    now: datetime,
    demand_req_per_min: float,
    capacity_req_per_min: float,
    failure_unit: str,
    replicas_per_host: int = 1,
    zones: int | Sequence[str] = 1,
    headroom_ratio: float = 0.0,
    gpus_per_replica: int = 1,
    usd_per_gpu_hour: float | None = None,
    hours_per_month: float | None = None,
    recovery_interval_s: float | None = None,
    backlog_requests: float | None = None,
    replacement_startup_s: float | None = None,
    startup_dependencies: Sequence[str] = (),
    hosts: Sequence[int] = (),
) -> DecisionRecord:
    """The decision record for stated assumptions; bad values raise RequirementError."""
    optional: dict[str, dict[str, Any]] = {
        "recovery": {
            "interval_s": recovery_interval_s,
            "backlog_requests": backlog_requests,
            "replacement_startup_s": replacement_startup_s,
            "startup_dependencies": list(startup_dependencies) or None,
        },
        "cost": {"usd_per_gpu_hour": usd_per_gpu_hour, "hours_per_month": hours_per_month},
        "placement": {
            "replicas_per_host": replicas_per_host,
            "zones": zone_names(zones),
            "candidate_hosts": list(hosts) or None,
        },
    }
    data: dict[str, Any] = {
        "name": "size",
        "failure_unit": failure_unit,
        "headroom_ratio": headroom_ratio,
        "demand": {"req_per_min": demand_req_per_min},
        "replica": {"capacity_req_per_min": capacity_req_per_min, "gpus": gpus_per_replica},
    }
    for section, values in optional.items():
        data[section] = {key: value for key, value in values.items() if value is not None}
    try:
        requirement = parse_requirement(data, where=WHERE)
    except RequirementError as exc:
        raise RequirementError(_with_option_names(str(exc))) from exc
    return recommend(requirement, now=now)


def size_from_file(path: Path, *, now: datetime) -> DecisionRecord:
    """`servewatch size --requirement FILE`: the worksheet for a requirement file, no data."""
    return recommend(load_requirement(path), now=now)


def _with_option_names(message: str) -> str:
    for path, option in sorted(OPTIONS.items(), key=lambda item: -len(item[0])):
        prefix = f"{WHERE}: {path}"
        if message.startswith(prefix):
            return f"{WHERE}: {option}{message[len(prefix) :]}"
    return message
