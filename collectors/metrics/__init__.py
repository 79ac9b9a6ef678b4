"""Metric pages: the exposition parser, the vLLM and DCGM catalogues,
and pages into the store."""
