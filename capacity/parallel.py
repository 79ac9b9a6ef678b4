"""Parallel map: independent simulations (resampled knee searches, candidate drills) spread over
the CPUs this process may use.

A `Mapper` applies a function to each item and returns the results in item order, so a result
never depends on how the work was spread. `serial_map` is the default everywhere; the shell
(`recommend`, `drill`, the demo, the service) opens `process_map` once per command and passes it
down. Workers are started by a fork server (a clean process, not a fork of one whose Polars and
DuckDB threads hold locks) and import what they run; on one CPU no worker is started.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Mapper(Protocol):
    def __call__(self, fn: Callable[[T], R], items: Sequence[T], /) -> list[R]: ...


def serial_map(fn: Callable[[T], R], items: Sequence[T], /) -> list[R]:
    return [fn(item) for item in items]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, as `taskset` sets it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def process_map(workers: int | None = None) -> Iterator[Mapper]:
    """A mapper over `workers` processes (default: the usable CPUs); serial on one."""
    count = usable_cpus() if workers is None else workers
    if count <= 1:
        yield serial_map
        return
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:

        def mapped(fn: Callable[[T], R], items: Sequence[T], /) -> list[R]:
            if len(items) <= 1:
                return [fn(item) for item in items]
            return list(pool.map(fn, items))

        yield mapped
