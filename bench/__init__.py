"""Benchmarks: each measures servewatch next to a named peer doing the same work in the same run."""
