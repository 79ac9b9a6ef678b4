"""Dashboards: pure Altair chart builders and offline report export."""
