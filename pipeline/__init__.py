"""The ground floor: canonical table schemas, signals, PromQL and the pure SLI transforms.

Nothing here talks to the network, opens the store or imports another room of the project. The
surface below is what the rooms above use most; every module is importable on its own.
"""

from servewatch.pipeline.request_minutes import EventCriterion, request_minutes, slo_minutes
from servewatch.pipeline.request_sli import TPOT_SQL, GoodputLimits, request_slis, with_tpot
from servewatch.pipeline.signals import Signal, Source
from servewatch.pipeline.sli_report import Grouping, SliSource, build_sli_report
from servewatch.pipeline.window import TimeSpan, Window, WindowQuery

__all__ = [
    "TPOT_SQL",
    "EventCriterion",
    "GoodputLimits",
    "Grouping",
    "Signal",
    "SliSource",
    "Source",
    "TimeSpan",
    "Window",
    "WindowQuery",
    "build_sli_report",
    "request_minutes",
    "request_slis",
    "slo_minutes",
    "with_tpot",
]
