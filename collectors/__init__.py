"""Talking to sources: decoding wire formats and reading them into the store.

Collectors turn what a fleet emits (OTLP spans, Prometheus expositions) into rows of the
store's canonical tables; they compute no SLIs.
"""
