"""Alert windows: rows of the multiwindow, multi-burn-rate table and the burn-rate threshold
each row implies for an SLO's period.

The table is data (`burn_windows.toml`, the SRE Workbook's recommendation for a 30-day
period); a spec may bring its own rows. A row says "alert with this severity when
`budget_ratio` of the period's error budget would be spent within `long_window`", so its
threshold is derived, never typed: burn_threshold = budget_ratio * period / long_window (14.4
for 2 % in 1 h of 30 days).

For another period the default rows keep their burn rates and scale their windows by
period / 30 d, rounded to whole minutes, as Pyrra scales its table by period / 28 d: a 7-day
SLO pages at 14.4x over 14m and 1m, and its slowest ticket fires at 1x over 16h48m and 1h24m
(docs/slo.md). No row may fire below a burn rate of 1: a budget burning slower lasts the period.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from servewatch.slo.durations import format_duration
from servewatch.slo.fields import Fields, SpecError, read_toml

DEFAULT_WINDOWS_PATH = Path(__file__).with_name("burn_windows.toml")
# The workbook pairs each long window with one twelfth of it as the short window.
SHORT_WINDOW_DIVISOR = 12
# The period the default table is written for (the workbook's and Sloth's default).
REFERENCE_PERIOD_S = 30 * 86400
# A budget burning at 1 lasts exactly the period; an alert below that says nothing is wrong.
MIN_BURN_THRESHOLD = 1.0


class Severity(Enum):
    """Who is told: a page wakes someone now, a ticket waits for working hours."""

    PAGE = "page"
    TICKET = "ticket"


@dataclass(frozen=True)
class BurnWindow:
    severity: Severity
    long_window_s: int
    short_window_s: int
    budget_ratio: float
    for_s: int = 0
    # Set when the row was scaled to another period: the burn rate it keeps (`scaled_to`).
    fixed_burn_threshold: float | None = None

    def burn_threshold(self, *, period_s: int) -> float:
        """The burn rate that spends `budget_ratio` of the budget in `long_window_s`."""
        if self.fixed_burn_threshold is not None:
            return self.fixed_burn_threshold
        return self.budget_ratio * period_s / self.long_window_s

    def scaled_to(
        self, *, period_s: int, reference_period_s: int = REFERENCE_PERIOD_S
    ) -> BurnWindow:
        """This row (written for `reference_period_s`) for an SLO of `period_s`: windows
        scaled by the ratio of the periods and rounded to whole minutes (at least one), the
        burn threshold kept. `budget_ratio` becomes the share of the budget the scaled long
        window spends at that threshold."""
        if period_s == reference_period_s:
            return self
        threshold = self.burn_threshold(period_s=reference_period_s)

        def scaled(seconds: int) -> int:
            return max(60, round(seconds * period_s / reference_period_s / 60) * 60)

        long_s, short_s = scaled(self.long_window_s), scaled(self.short_window_s)
        return BurnWindow(
            severity=self.severity,
            long_window_s=long_s,
            short_window_s=min(short_s, long_s - 60),
            budget_ratio=threshold * long_s / period_s,
            for_s=scaled(self.for_s) if self.for_s else 0,
            fixed_burn_threshold=threshold,
        )

    @property
    def long_window(self) -> str:
        return format_duration(self.long_window_s)

    @property
    def short_window(self) -> str:
        return format_duration(self.short_window_s)


def burn_window_from_fields(fields: Fields) -> BurnWindow:
    """One table row; `fields` knows its file and path, so errors point at the row."""
    severity = fields.choice("severity", Severity)
    long_window_s = fields.duration_s("long_window")
    default_short_s = long_window_s // SHORT_WINDOW_DIVISOR
    if not fields.has("short_window") and default_short_s % 60:
        raise fields.fail(
            "short_window",
            f"is required here: long_window / {SHORT_WINDOW_DIVISOR} is not whole minutes",
        )
    short_window_s = fields.duration_s("short_window", default_s=default_short_s)
    if short_window_s >= long_window_s:
        raise fields.fail(
            "short_window",
            f"{format_duration(short_window_s)} must be shorter than long_window "
            f"{format_duration(long_window_s)}",
        )
    budget_ratio = fields.number("budget_ratio")
    if budget_ratio is None:
        raise fields.fail("budget_ratio", "is required (fraction of the budget, e.g. 0.02)")
    if not 0 < budget_ratio <= 1:
        raise fields.fail(
            "budget_ratio", f"must be above 0 and at most 1 (0.02 is 2 %), got {budget_ratio}"
        )
    for_s = fields.duration_s("for", default_s=0, zero=True)
    fields.done()
    return BurnWindow(severity, long_window_s, short_window_s, budget_ratio, for_s)


def burn_windows_from_items(items: Sequence[Fields]) -> tuple[BurnWindow, ...]:
    """Rows of a table; two rows with the same pair of windows would be one alert twice."""
    windows: list[BurnWindow] = []
    seen: set[tuple[int, int]] = set()
    for item in items:
        window = burn_window_from_fields(item)
        pair = (window.long_window_s, window.short_window_s)
        if pair in seen:
            raise item.fail(
                "long_window",
                f"the pair {window.long_window}/{window.short_window} appears twice; each "
                "pair of windows is one alert",
            )
        seen.add(pair)
        windows.append(window)
    return tuple(windows)


def load_burn_windows(path: Path = DEFAULT_WINDOWS_PATH) -> tuple[BurnWindow, ...]:
    """The table in a TOML file of `[[windows]]` rows (see `burn_windows.toml`)."""
    root = Fields(read_toml(path, error=SpecError), where=str(path))
    windows = burn_windows_from_items(root.items("windows", required=True))
    root.done()
    if not windows:
        raise root.fail("windows", "needs at least one row")
    return windows


@functools.cache
def default_burn_windows() -> tuple[BurnWindow, ...]:
    """The default table as written, for `REFERENCE_PERIOD_S`."""
    return load_burn_windows(DEFAULT_WINDOWS_PATH)


def windows_for_period(
    windows: Sequence[BurnWindow], *, period_s: int, reference_period_s: int = REFERENCE_PERIOD_S
) -> tuple[BurnWindow, ...]:
    """A default table (written for `reference_period_s`) scaled to an SLO's period."""
    return tuple(
        w.scaled_to(period_s=period_s, reference_period_s=reference_period_s) for w in windows
    )
