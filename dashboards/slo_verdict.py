"""SLO verdict: the answer at the top of the report, per SLO: met or not over its period, good
of total events, error budget left, the burn rate of each alert window, and which alerts fired
in the report window and which still fire at its end.

The shell translates the SLO evaluation (`slo.status.SloStatus` and the alert history) into
these plain records; this module only decides what a verdict says and renders it as HTML.
Every value from the fleet is escaped. A period that counted no events has no verdict: it says
"no data", never a full budget.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum


class VerdictState(Enum):
    MET = "met"
    MISSED = "missed"
    NO_DATA = "no data"


@dataclass(frozen=True)
class AlertFigure:
    """One burn-rate alert of an SLO: its windows, threshold and burn rates at the verdict's
    instant, its state then, and how often it started firing within the report window."""

    severity: str
    window: str
    short_window: str
    burn_threshold: float | None
    long_burn_rate: float | None
    short_burn_rate: float | None
    state: str
    state_since: datetime | None
    fired_in_window: int

    @property
    def name(self) -> str:
        return f"{self.severity} {self.window}/{self.short_window}"

    @property
    def firing(self) -> bool:
        return self.state == "firing"


@dataclass(frozen=True)
class SloVerdict:
    slo: str
    objective_ratio: float
    period: str
    at: datetime
    good: int
    total: int
    budget_remaining_ratio: float | None
    alerts: tuple[AlertFigure, ...]
    events: str = "requests"
    # Set when the evaluation itself says the period holds no data (whatever the counts say).
    no_data: bool = False

    @property
    def state(self) -> VerdictState:
        if self.no_data or self.total <= 0:
            return VerdictState.NO_DATA
        return (
            VerdictState.MET
            if self.good / self.total >= self.objective_ratio
            else (VerdictState.MISSED)
        )

    @property
    def attainment_ratio(self) -> float | None:
        return None if self.total <= 0 else self.good / self.total

    @property
    def firing(self) -> tuple[AlertFigure, ...]:
        return tuple(a for a in self.alerts if a.firing)

    @property
    def fired(self) -> tuple[AlertFigure, ...]:
        return tuple(a for a in self.alerts if a.fired_in_window > 0)


def _ratio(value: float | None, digits: int = 2) -> str:
    return "no data" if value is None else f"{value:.{digits}%}"


def _burn(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def budget_text(verdict: SloVerdict) -> str:
    if verdict.state is VerdictState.NO_DATA or verdict.budget_remaining_ratio is None:
        return "no data"
    left = verdict.budget_remaining_ratio
    return f"{left:.1%} left" if left >= 0 else f"overspent by {-left:.1%}"


def verdict_sentence(verdict: SloVerdict) -> str:
    """One line a person reads first: `chat-goodput missed: 99.07% good against 99%`."""
    state = verdict.state
    if state is VerdictState.NO_DATA:
        return (
            f"{verdict.slo}: no data: no {verdict.events} counted in the {verdict.period} "
            f"ending {verdict.at:%Y-%m-%d %H:%M} UTC"
        )
    return (
        f"{verdict.slo} {state.value}: {_ratio(verdict.attainment_ratio)} of "
        f"{verdict.events} good against an objective of {verdict.objective_ratio:.3g}"
        f" ({verdict.objective_ratio:.2%}) over {verdict.period}"
    )


def _alert_list(alerts: Sequence[AlertFigure], *, empty: str) -> str:
    if not alerts:
        return f'<span class="quiet">{html.escape(empty)}</span>'
    return "<br>".join(html.escape(a.name) for a in alerts)


def _burn_cells(verdict: SloVerdict) -> str:
    lines = []
    for alert in verdict.alerts:
        threshold = (
            "" if alert.burn_threshold is None else f" (alerts at {alert.burn_threshold:.3g})"
        )
        lines.append(
            f"{alert.window}: {_burn(alert.long_burn_rate)} · {alert.short_window}: "
            f"{_burn(alert.short_burn_rate)}{threshold}"
        )
    return "<br>".join(html.escape(line) for line in lines) or "-"


def verdicts_html(verdicts: Sequence[SloVerdict]) -> str:
    """The verdict table: one row per SLO (the verdict's state as a class for the colours)."""
    if not verdicts:
        return ""
    at = verdicts[0].at
    head = (
        "<tr><th>SLO</th><th>verdict</th><th>good / total</th><th>error budget</th>"
        "<th>burn rate per alert window (long · short)</th><th>alerts firing</th>"
        "<th>alerts fired in the window</th></tr>"
    )
    rows = []
    for verdict in verdicts:
        state = verdict.state
        counts = (
            f"{verdict.good:,} / {verdict.total:,} {verdict.events}"
            if verdict.total > 0
            else f"0 / 0 {verdict.events}"
        )
        fired = [
            a.name + (f" ({a.fired_in_window} times)" if a.fired_in_window > 1 else "")
            for a in verdict.fired
        ]
        rows.append(
            f'<tr class="verdict-{state.name.lower().replace("_", "-")}" '
            f'data-slo="{html.escape(verdict.slo)}">'
            f"<th>{html.escape(verdict.slo)}<br><span class='quiet'>objective "
            f"{verdict.objective_ratio:.2%} over {html.escape(verdict.period)}</span></th>"
            f'<td class="verdict">{html.escape(state.value)}<br><span class="quiet">'
            f"{html.escape(_ratio(verdict.attainment_ratio))} good</span></td>"
            f"<td>{html.escape(counts)}</td>"
            f'<td class="budget">{html.escape(budget_text(verdict))}</td>'
            f'<td class="burn">{_burn_cells(verdict)}</td>'
            f'<td class="firing">{_alert_list(verdict.firing, empty="none")}</td>'
            f'<td class="fired">'
            + ("<br>".join(html.escape(f) for f in fired) or '<span class="quiet">none</span>')
            + "</td></tr>"
        )
    caption = (
        f"Each SLO over its own period ending {at:%Y-%m-%d %H:%M} UTC, the end of the report "
        "window; burn rates over each alert's long and short windows (1 spends the budget "
        "exactly over the period)."
    )
    return (
        f'<table class="verdicts" id="slo-verdicts"><caption>{html.escape(caption)}</caption>'
        f"{head}{''.join(rows)}</table>"
    )
