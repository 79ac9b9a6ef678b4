"""SLOs: specs, error budgets, burn rates, alerts and Prometheus rule generation."""
