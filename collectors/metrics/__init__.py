"""Metric pages: the exposition parser, the vLLM and DCGM catalogues, the GPU join,
and pages into the store."""
