"""Each package names its public surface in `__all__`, and this pins it (as httpx does): a
name added to or dropped from a package's surface is a decision, made here too."""

from __future__ import annotations

import importlib
import inspect

import pytest

SURFACES: dict[str, list[str]] = {
    "servewatch": ["__version__"],
    "servewatch.pipeline": [
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
    ],
    "servewatch.store": [
        "EXPORT_TABLES",
        "IN_MEMORY",
        "Clock",
        "CompactionReport",
        "ExportError",
        "ExportedFile",
        "GoodEventLimits",
        "Holder",
        "MinuteRollupSwap",
        "PartitionError",
        "PartitionRollupReport",
        "PartitionWriter",
        "PartitionWritten",
        "RollupReport",
        "SchemaTooNewError",
        "Store",
        "StoreBusyError",
        "StoreDamagedError",
        "StoreError",
        "StoreMissingError",
        "StorePathError",
        "damage_error",
        "read_holder",
        "remove_holder",
        "roll_up_request_minutes",
        "roll_up_requests",
        "roll_up_slo_minutes",
        "utc_now",
        "write_holder",
    ],
    "servewatch.health": [
        "Detector",
        "Finding",
        "FindingKind",
        "HealthInputs",
        "ScopeUnit",
        "default_detectors",
    ],
    "servewatch.collectors": [
        "OtlpGrpcReceiver",
        "OtlpHttpReceiver",
        "ScrapeLoop",
        "StoreWriter",
        "Target",
        "TargetKind",
        "fetch_document",
        "fetch_window",
        "ingest_pages",
        "ingest_trace_files",
        "replay_fixture",
    ],
    "servewatch.slo": [
        "AlertmanagerNotifier",
        "SloSpec",
        "SloStatus",
        "load_slo_file",
        "prometheus_rules",
        "slo_status",
    ],
    "servewatch.dashboards": ["Report", "ReportInputs", "build_report", "write_report"],
    "servewatch.capacity": [
        "DecisionRecord",
        "DrillSpec",
        "Requirement",
        "fit_capacity",
        "load_requirement",
    ],
    "servewatch.emulator": ["FleetConfig", "FleetSimulation", "load_fleet_config"],
    "servewatch.cli": ["app", "main"],
}


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_the_public_surface_is_as_pinned(name: str) -> None:
    package = importlib.import_module(name)
    assert sorted(package.__all__) == sorted(SURFACES[name])
    for member in package.__all__:
        assert hasattr(package, member), f"{name}.__all__ names {member}, which it lacks"


@pytest.mark.parametrize("name", sorted(SURFACES))
def test_every_public_name_of_a_package_is_in_its_surface(name: str) -> None:
    # Subpackages and modules are reached by their own names, not through the surface.
    package = importlib.import_module(name)
    public = {
        member
        for member, value in vars(package).items()
        if not member.startswith("_") and not inspect.ismodule(value) and member != "annotations"
    }
    assert public <= set(package.__all__), sorted(public - set(package.__all__))
