"""Run benchmarks: `python -m bench [NAME ...] [--quick]` (all when no name is given).

Every module of this package that defines `run(*, quick: bool) -> list[Comparison]` is a
benchmark named after the module; `--quick` runs it on smaller inputs for a fast look.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from bench.report import Comparison

Runner = Callable[..., list[Comparison]]


def discover() -> dict[str, Runner]:
    found: dict[str, Runner] = {}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("_") or info.name == "report":
            continue
        module = importlib.import_module(f"bench.{info.name}")
        run = getattr(module, "run", None)
        if callable(run):
            found[info.name] = run
    return found


def main() -> None:
    benchmarks = discover()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"benchmarks to run: {', '.join(benchmarks)}")
    parser.add_argument("--quick", action="store_true", help="smaller inputs, for a fast look")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(benchmarks))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(benchmarks)}")
    for name in args.names or sorted(benchmarks):
        for comparison in benchmarks[name](quick=args.quick):
            print("\n".join(comparison.lines()), flush=True)


if __name__ == "__main__":
    main()
