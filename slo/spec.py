"""SLO specs: what is measured (the SLI), the objective over a rolling period, the scope it
covers, and the alert windows. `slo.spec_file` builds them from files; everything downstream
takes these typed objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from servewatch.pipeline.metric_minutes import MetricCriterion
from servewatch.pipeline.request_minutes import EventCriterion
from servewatch.pipeline.signals import Signal
from servewatch.slo.buckets import LatencyMetric
from servewatch.slo.durations import format_duration
from servewatch.slo.windows import BurnWindow

DAY_S = 86400
PERIODS_S: tuple[int, ...] = (7 * DAY_S, 28 * DAY_S, 30 * DAY_S)
# Columns of the per-minute counts a scope may select on (the request dimensions).
SCOPE_KEYS: tuple[str, ...] = ("pool", "model", "tenant", "adapter", "replica")
# vLLM's histogram of each per-request latency an SLO can bound.
HISTOGRAM_SIGNALS = {
    LatencyMetric.TTFT: Signal.TTFT_S,
    LatencyMetric.TPOT: Signal.REQUEST_TPOT_S,
    LatencyMetric.E2E: Signal.E2E_LATENCY_S,
}


class SliKind(Enum):
    LATENCY = "latency"
    AVAILABILITY = "availability"
    GOODPUT = "goodput"
    TOKEN_GOODPUT = "token_goodput"  # noqa: S105 - an SLI kind that says "token", no secret


class SliSource(Enum):
    """Where good and total events are counted: traced requests, or vLLM's own metrics
    (latency histograms, the request_success counter)."""

    TRACES = "traces"
    METRICS = "metrics"


@dataclass(frozen=True)
class LatencySli:
    """A request is good when it succeeded within `threshold_s` on `metric` (inclusive)."""

    metric: LatencyMetric
    threshold_s: float
    source: SliSource = SliSource.TRACES

    @property
    def kind(self) -> SliKind:
        return SliKind.LATENCY


@dataclass(frozen=True)
class AvailabilitySli:
    """A request is good when it did not fail."""

    source: SliSource = SliSource.TRACES

    @property
    def kind(self) -> SliKind:
        return SliKind.AVAILABILITY


@dataclass(frozen=True)
class GoodputSli:
    """A request is good when it succeeded and met both limits: vLLM's goodput criterion.
    Only traces can tell, per request, whether both held."""

    ttft_s: float
    tpot_s: float

    @property
    def kind(self) -> SliKind:
        return SliKind.GOODPUT

    @property
    def source(self) -> SliSource:
        return SliSource.TRACES


@dataclass(frozen=True)
class TokenGoodputSli:
    """Goodput counted in output tokens: the good events are the output tokens of requests
    that succeeded and met both limits, the total the output tokens of every request (failed
    ones included), so the ratio is good output tokens / all output tokens (docs/slo.md)."""

    ttft_s: float
    tpot_s: float

    @property
    def kind(self) -> SliKind:
        return SliKind.TOKEN_GOODPUT

    @property
    def source(self) -> SliSource:
        return SliSource.TRACES


Sli = LatencySli | AvailabilitySli | GoodputSli | TokenGoodputSli


@dataclass(frozen=True)
class SloSpec:
    name: str
    sli: Sli
    objective_ratio: float
    period_s: int
    windows: tuple[BurnWindow, ...]
    scope: tuple[tuple[str, str], ...] = ()
    min_events: int = 1
    labels: tuple[tuple[str, str], ...] = ()
    description: str = ""

    @property
    def counts_tokens(self) -> bool:
        """Whether this SLO's events are output tokens (`slo_minutes.good_output_tokens` and
        `output_tokens`) rather than requests (`good` and `total`)."""
        return isinstance(self.sli, TokenGoodputSli)

    @property
    def error_budget_ratio(self) -> float:
        return 1 - self.objective_ratio

    @property
    def period(self) -> str:
        return format_duration(self.period_s)

    @property
    def alert_labels(self) -> tuple[tuple[str, str], ...]:
        """The labels its alerts carry besides their identity: its scope and its labels."""
        return tuple(sorted((*self.scope, *self.labels)))

    def burn_threshold(self, window: BurnWindow) -> float:
        return window.burn_threshold(period_s=self.period_s)

    def max_error_ratio(self, window: BurnWindow) -> float:
        """The error ratio both windows must exceed. Computed as threshold * (1 - objective),
        the same float the generated PromQL computes, so both sides agree at the boundary."""
        return self.burn_threshold(window) * (1 - self.objective_ratio)

    def window_lengths_s(self) -> tuple[int, ...]:
        """Every window whose sums this SLO needs: its alert windows and its period."""
        lengths = {self.period_s}
        for window in self.windows:
            lengths.update((window.long_window_s, window.short_window_s))
        return tuple(sorted(lengths))

    def metric_criterion(self) -> MetricCriterion | None:
        """How this SLO counts its events from vLLM's metrics; None when it counts traces."""
        match self.sli:
            case LatencySli(source=SliSource.METRICS) as sli:
                return MetricCriterion(
                    self.name, histogram=HISTOGRAM_SIGNALS[sli.metric], threshold_s=sli.threshold_s
                )
            case AvailabilitySli(source=SliSource.METRICS):
                return MetricCriterion(self.name)
            case _:
                return None

    def event_criterion(self) -> EventCriterion | None:
        """What makes a traced request good for this SLO, for the pipeline's minute rollups;
        None when the SLO is counted from metrics instead."""
        match self.sli:
            case LatencySli(source=SliSource.TRACES) as sli:
                return EventCriterion(
                    self.name,
                    ttft_limit_s=sli.threshold_s if sli.metric is LatencyMetric.TTFT else None,
                    tpot_limit_s=sli.threshold_s if sli.metric is LatencyMetric.TPOT else None,
                    e2e_limit_s=sli.threshold_s if sli.metric is LatencyMetric.E2E else None,
                )
            case AvailabilitySli(source=SliSource.TRACES):
                return EventCriterion(self.name)
            case GoodputSli() | TokenGoodputSli() as sli:
                return EventCriterion(self.name, ttft_limit_s=sli.ttft_s, tpot_limit_s=sli.tpot_s)
            case _:
                return None
