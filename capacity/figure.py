"""Figure: one number of a recommendation with its unit, its source and its plausible range.

A recommendation is only as defensible as its inputs, so no bare floats cross a module boundary
of the recommender: every value says whether it was measured (and from what), assumed (and by
whom or on what basis) or derived (and by which formula from which other figures). The range
(`low`, `high`) is what the risk analysis perturbs; a figure without one is not perturbed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum


class SourceKind(Enum):
    MEASURED = "measured"
    ASSUMED = "assumed"
    DERIVED = "derived"


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    kind: SourceKind
    basis: str
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if math.isnan(self.value):
            raise ValueError(f"figure ({self.basis}) is NaN")
        if (self.low is None) != (self.high is None):
            raise ValueError(f"figure ({self.basis}) needs both low and high, or neither")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(
                f"figure ({self.basis}) has low {self.low} above high {self.high}; "
                "a range runs from low to high"
            )

    @property
    def source(self) -> str:
        return f"{self.kind.value}: {self.basis}"

    @property
    def has_range(self) -> bool:
        return self.low is not None

    def with_value(self, value: float) -> Figure:
        """The same figure moved to `value` (the range is dropped: it described the old value)."""
        return replace(self, value=value, low=None, high=None)

    def with_range(self, low: float, high: float, *, why: str) -> Figure:
        return replace(self, low=low, high=high, basis=f"{self.basis}; range {why}")

    def text(self) -> str:
        """The value with its unit, for sentences: '1,900 tokens/s'."""
        return f"{fmt(self.value)} {self.unit}".rstrip()


@dataclass(frozen=True)
class Step:
    """One line of a worksheet: what the number is, and the number with its source."""

    label: str
    figure: Figure


def assumed(
    value: float, unit: str, basis: str, *, low: float | None = None, high: float | None = None
) -> Figure:
    return Figure(value, unit, SourceKind.ASSUMED, basis, low, high)


def measured(
    value: float, unit: str, basis: str, *, low: float | None = None, high: float | None = None
) -> Figure:
    return Figure(value, unit, SourceKind.MEASURED, basis, low, high)


def derived(value: float, unit: str, formula: str) -> Figure:
    return Figure(value, unit, SourceKind.DERIVED, formula)


def fmt(value: float) -> str:
    """A number as a person writes it in a worksheet: 83,333 / 37.6 / 0.667 / unbounded."""
    if math.isinf(value):
        return "unbounded" if value > 0 else "-unbounded"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}".removesuffix(".0")
    return f"{value:.3g}"
