"""Dashboards: pure Altair chart builders and offline report export."""

from servewatch.dashboards.export import write_report
from servewatch.dashboards.report import Report, ReportInputs, build_report

__all__ = [
    "Report",
    "ReportInputs",
    "build_report",
    "write_report",
]
