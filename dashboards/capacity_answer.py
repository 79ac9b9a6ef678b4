"""Capacity answer: the recommended fleet and what it costs, as the report states it before its
failure table, tornado and drill.

The shell fills it from a decision record (`capacity.decision_record`); this module renders it.
"""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass(frozen=True)
class CapacityAnswer:
    requirement: str
    # The record's own verdict sentence: the fleet, why, the drill and the cost.
    verdict: str
    feasible: bool
    hosts: int | None = None
    replicas: int | None = None
    gpus: int | None = None
    zones: int | None = None
    hosts_today: int | None = None
    usd_per_month: float | None = None
    reserve_usd_per_month: float | None = None
    usd_per_hour: float | None = None
    measured_capacity: str | None = None

    @property
    def headline(self) -> str:
        if not self.feasible or self.hosts is None:
            return "No fleet meets the requirement"
        fleet = (
            f"{self.hosts} hosts ({self.replicas} replicas, {self.gpus} GPUs, in {self.zones} "
            f"zone{'s' if self.zones != 1 else ''})"
        )
        if self.hosts_today:
            fleet += f"; {self.hosts_today} in service today"
        return f"Recommended fleet: {fleet}"


def _usd(value: float) -> str:
    return f"${value:,.0f}" if value >= 100 else f"${value:,.2f}"


def answer_html(answer: CapacityAnswer) -> str:
    facts: list[tuple[str, str]] = [("requirement", answer.requirement)]
    if answer.usd_per_month is not None:
        cost = f"{_usd(answer.usd_per_month)}/month"
        if answer.usd_per_hour is not None:
            cost += f" ({_usd(answer.usd_per_hour)}/hour)"
        facts.append(("cost", cost))
    if answer.reserve_usd_per_month is not None:
        facts.append(
            (
                "reserve cost",
                (
                    f"{_usd(answer.reserve_usd_per_month)}/month buys the failure reserve beyond "
                    "the fleet that meets healthy demand"
                ),
            )
        )
    if answer.measured_capacity:
        facts.append(("measured capacity", answer.measured_capacity))
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return (
        f'<div class="capacity-answer" id="capacity-answer">'
        f'<p class="headline">{html.escape(answer.headline)}</p>'
        f'<table class="facts">{rows}</table>'
        f'<p class="verdict-text">{html.escape(answer.verdict)}</p></div>'
    )
