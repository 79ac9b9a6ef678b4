"""SLOs: specs, error budgets, burn rates, alerts and Prometheus rule generation."""

from servewatch.slo.alertmanager import AlertmanagerNotifier
from servewatch.slo.imports import load_slo_file
from servewatch.slo.prometheus_rules import prometheus_rules
from servewatch.slo.spec import SloSpec
from servewatch.slo.status import SloStatus, slo_status

__all__ = [
    "AlertmanagerNotifier",
    "SloSpec",
    "SloStatus",
    "load_slo_file",
    "prometheus_rules",
    "slo_status",
]
