"""Prometheus' HTTP API: the client, and a fleet's history read from it into the store."""
