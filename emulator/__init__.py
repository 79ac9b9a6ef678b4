"""Emulated vLLM fleets that speak the real wire formats (Prometheus text, OTLP).

Everything the emulator produces says it is emulated (the resource attribute
`servewatch.emulated`), so it can never be mistaken for measurements of a real fleet.

The hot modules may run compiled (emulator/native.py): only a build made from exactly the
current sources is ever loaded, otherwise the sources run as they are.
"""

from servewatch.emulator import native as _native

_native.activate(__path__)

# After activation, so that the modules below load compiled when a build matches. Not the
# fixture writer: its helper process runs `python -m servewatch.emulator.fixture_files`, which
# must not be imported before it runs.
from servewatch.emulator.fleet import FleetSimulation  # noqa: E402
from servewatch.emulator.fleet_config import FleetConfig, load_fleet_config  # noqa: E402

__all__ = ["FleetConfig", "FleetSimulation", "load_fleet_config"]
