"""Emulated vLLM fleets that speak the real wire formats (Prometheus text, OTLP).

Everything the emulator produces says it is emulated (the resource attribute
`servewatch.emulated`), so it can never be mistaken for measurements of a real fleet.
"""
