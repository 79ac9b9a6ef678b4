"""Run benchmarks: `python -m bench [NAME ...] [--spans N]` (all when no name is given)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bench import ingest_spans
from bench.report import Comparison


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help="benchmarks to run: ingest_spans")
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans for ingest_spans")
    args = parser.parse_args()
    benchmarks: dict[str, Callable[[], Comparison]] = {
        "ingest_spans": lambda: ingest_spans.run(args.spans),
    }
    unknown = sorted(set(args.names) - set(benchmarks))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(benchmarks)}")
    for name in args.names or list(benchmarks):
        print("\n".join(benchmarks[name]().lines()), flush=True)


if __name__ == "__main__":
    main()
