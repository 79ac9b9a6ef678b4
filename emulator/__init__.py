"""Emulated vLLM fleets that speak the real wire formats (Prometheus text, OTLP).

Everything the emulator produces says it is emulated (the resource attribute
`servewatch.emulated`), so it can never be mistaken for measurements of a real fleet.

The hot modules may run compiled (emulator/native.py): only a build made from exactly the
current sources is ever loaded, otherwise the sources run as they are.
"""

from servewatch.emulator import native as _native

_native.activate(__path__)
